"""`make demo`: the whole loop, Kafka -> Spark -> PostgreSQL -> outbox relay -> Kafka, under fire.

plan.py       what the filler sends (committed, aborted, redelivered) and when each component dies
fill.py       the input producer: Kafka transactions, some aborted, some events redelivered
transform.py  the Spark job (a child process): kafka_rc -> n squared -> PostgresSink(outbox=...)
verdict.py    the checks over what came out: duplicates, missing, order, leaks, wrong values, latency
show.py       live progress, the verdict table and the chart (rich, matplotlib)
run.py        the conductor: services, children, kills, restarts, the final read
"""
