"""``python -m coordinator``: the same as ``txbridge coordinator``."""

import logging

from coordinator.cli import coordinator

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("txbridge.librdkafka").setLevel(logging.ERROR)
    coordinator()
