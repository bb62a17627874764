"""A query starts with the state store it declares, and the session keeps its own (pure: a fake session)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from tandem.runtime.node import ROCKSDB_PROVIDER, STATE_STORE_PROVIDER, start_query

HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


class FakeConf:
    def __init__(self) -> None:
        self.values = {STATE_STORE_PROVIDER: HDFS}

    def get(self, key: str) -> str:
        return self.values[key]

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class FakeWriter:
    """Copies the session's provider when it starts, as Spark does, and takes a while about it."""

    def __init__(self, session: SimpleNamespace, started_with: list[tuple[str, str]], name: str) -> None:
        self.session, self.started_with, self.name = session, started_with, name

    def start(self) -> str:
        provider = self.session.conf.get(STATE_STORE_PROVIDER)
        time.sleep(0.02)
        self.started_with.append((self.name, provider))
        return self.name


def test_queries_started_from_several_threads_get_their_own_store_and_leave_the_sessions_alone() -> None:
    session = SimpleNamespace(conf=FakeConf())
    started_with: list[tuple[str, str]] = []
    declared = {f"q{i}": "rocksdb" if i % 2 else "default" for i in range(8)}

    def start(name: str) -> None:
        start_query(session, SimpleNamespace(state_store=declared[name]), FakeWriter(session, started_with, name))

    threads = [threading.Thread(target=start, args=(name,)) for name in declared]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert dict(started_with) == {name: ROCKSDB_PROVIDER if store == "rocksdb" else HDFS
                                  for name, store in declared.items()}
    assert session.conf.get(STATE_STORE_PROVIDER) == HDFS
