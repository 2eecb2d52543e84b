# examples/live_consumer.py: a consumer process following the store the producer writes,
# with consumer offsets of its own (a consumerOffset.json outside the store).
import sys

from rocketstore import LiveReader

root, group, offsets = sys.argv[1], sys.argv[2], sys.argv[3]
with LiveReader(root, offsets_path=offsets) as reader:
    count = 0
    with reader.consume(group, "Orders", 0, batch_size=256) as consumer:
        for messages in consumer:                       # waits for each batch
            count += len(messages)
            if messages[-1].body == b"done":
                consumer.commit()
                break
    print(f"{group}: {count} messages, next offset {reader.query_offset(group, 'Orders', 0)}")
