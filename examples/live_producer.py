# examples/live_producer.py: a producer process; consumer processes follow its store.
import sys

from rocketstore import Message, MessageStore

root, n = sys.argv[1], int(sys.argv[2])
with MessageStore(root) as store:
    for i in range(n):
        store.put_message(Message("Orders", b"order-%d" % i, queue_id=0))
    store.put_message(Message("Orders", b"done", queue_id=0))
    print(f"producer: put {n + 1} messages")
