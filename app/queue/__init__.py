"""The queue and the worker protocol: claims, leases, heartbeats, reports, the reaper and the
workers' liveness.
"""
