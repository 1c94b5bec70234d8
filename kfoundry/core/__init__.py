"""The kfoundry core: hook specs, plugin manager, registries, config and the shared typed models."""
