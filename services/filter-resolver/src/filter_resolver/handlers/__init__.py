"""The handlers that must look something up: the built-ins and the plugins (RF-09)."""
