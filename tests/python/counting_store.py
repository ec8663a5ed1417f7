"""A dist.Store that counts the operations made on it (tests and bench/restart_checks_bench.py).

trainsup's store helpers take any dist.Store, including one written in Python; this one passes
every operation to `inner` (a TCPStore client, or a HashStore of its own by default) and adds
one to `ops` per operation."""
import torch.distributed as dist


class CountingStore(dist.Store):
    def __init__(self, inner=None):
        super().__init__()
        self.inner = dist.HashStore() if inner is None else inner
        self.ops = 0

    def set(self, key, value):
        self.ops += 1
        self.inner.set(key, value)

    def get(self, key):
        self.ops += 1
        return self.inner.get(key)

    def add(self, key, value):
        self.ops += 1
        return self.inner.add(key, value)

    def compare_set(self, key, expected, desired):
        self.ops += 1
        return self.inner.compare_set(key, expected, desired)

    def check(self, keys):
        self.ops += 1
        return self.inner.check(keys)

    def delete_key(self, key):
        self.ops += 1
        return self.inner.delete_key(key)

    def wait(self, keys, timeout=None):
        self.ops += 1
        self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)
