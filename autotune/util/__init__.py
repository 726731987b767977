"""Small helpers with no autotune imports: units of bytes and time, JSON files, redacting
secrets in URLs, process identity, and the host's cores.
"""
