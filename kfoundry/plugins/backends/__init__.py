"""Bundled kfoundry plugins."""
