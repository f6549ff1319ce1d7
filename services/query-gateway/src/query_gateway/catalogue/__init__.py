"""The catalogue file: read and checked at start-up (GS-08, GS-09), read again on SIGHUP."""
