"""How ranks reach each other, below any algorithm: the dedicated process groups, which ranks
share a host, the launcher, each rank's heartbeat, and the verdict on which peer failed.
"""
