"""Running things on this machine: the child launcher (launch), the stack of local processes (stack), a
redis-server (redis_server) and a Redis Cluster (redis_cluster) on free loopback ports. Nothing here runs in
a deployed service except `launch`, which the dispatcher's worker supervisor uses."""
