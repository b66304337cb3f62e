"""Executors that run independent units (search candidates): in this process, in
worker processes, or on Ray; ``factory.make_executor`` picks one."""
