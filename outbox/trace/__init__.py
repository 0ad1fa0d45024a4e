"""`outbox trace EVENT_ID`: one event's path through the sink, the outbox, the relay and Kafka.

- `report.py`  the path as plain values, and the human lines and JSON made of them
- `gather.py`  reading it: a tracing sink's records, dead letters, the outbox and relay positions,
               then the output topic around the time the event was applied
"""
