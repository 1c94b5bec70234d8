"""kfoundry as a tool for coding agents: a Model Context Protocol server (``kf-run mcp``).

Needs the optional extra ``mcp`` (the official MCP Python SDK). See ``docs/mcp.md``.
"""
