"""What the suite's service helpers share (slurm_cluster.py, k8s_cluster.py, prometheus_server.py):
daemons a test starts and stops by itself, a bounded wait that fails at once, naming the daemon,
when one of them exits, and the context manager that stops everything even when start() fails
half-way.

Subclasses set self.procs ({name: Popen}) and self.log_dir, and define start() (returning self)
and stop()."""
import time


class Daemons:
    procs: dict
    log_dir: object

    def start(self):
        raise NotImplementedError

    def stop(self):
        raise NotImplementedError

    def _until(self, pred, timeout, what):
        """pred()'s first true value, polled every 0.2 s for at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            got = pred()
            if got:
                return got
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited ({p.returncode}) while waiting for {what}; "
                                       f"logs in {self.log_dir}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not after {timeout} s; logs in {self.log_dir}")
            time.sleep(0.2)  # polls the daemons' state through their own interfaces; bounded

    def wait_for(self, pred, timeout, what):
        return self._until(pred, timeout, what)

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()
