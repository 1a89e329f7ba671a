"""``txbridge consume``: read topics like a RocketMQ consumer and print each message.

One line per message: ``topic=… tag=… key=… value=…`` (UTF-8 text, else a
Python bytes literal). SIGTERM or Ctrl-C stops cleanly and commits what was
printed.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from txbridge.consumer.model import (
    ConsumeConcurrentlyStatus,
    ConsumedMessage,
    ConsumeOrderlyStatus,
)
from txbridge.settings import bootstrap_option, client_options, one_line_errors, resolve_bootstrap
from txbridge.wire import DEFAULT_NAMESPACE

if TYPE_CHECKING:
    from txbridge.client_config import ClientConfig


def _text(data: bytes | None) -> str:
    if data is None:
        return "-"
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return repr(data)


def format_message(message: ConsumedMessage) -> str:
    """The printed line of a message."""
    tag = message.tag or "-"
    return f"topic={message.topic} tag={tag} key={_text(message.key)} value={_text(message.value)}"


class _Printer:
    """Prints messages and stops the run after ``max_messages`` (0: never) or ``idle_exit_s`` of silence."""

    def __init__(self, stop: threading.Event, max_messages: int, idle_exit_s: float) -> None:
        self.stop = stop
        self.max_messages = max_messages
        self.idle_exit_s = idle_exit_s
        self.count = 0
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def __call__(self, message: ConsumedMessage) -> None:
        with self.lock:
            click.echo(format_message(message))
            self.count += 1
            self.last = time.monotonic()
            if self.max_messages and self.count >= self.max_messages:
                self.stop.set()

    def watch_idle(self) -> None:
        while self.idle_exit_s and not self.stop.wait(0.2):
            if time.monotonic() - self.last >= self.idle_exit_s:
                self.stop.set()


def _options(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            bootstrap_option,
            client_options,
            click.option(
                "--topic", "topics", multiple=True, required=True, help="Topic to read (repeatable)."
            ),
            click.option("--group", required=True, help="Consumer group."),
            click.option("--subscription", default="*", show_default=True, help="Tags: '*', 'TAGA || TAGB'."),
            click.option(
                "--namespace", default=DEFAULT_NAMESPACE, show_default=True, help="txbridge namespace."
            ),
            click.option("--max-messages", default=0, help="Stop after this many messages (0: never)."),
            click.option("--idle-exit", default=0.0, help="Stop after this many seconds without a message."),
        ]
    ):
        func = option(func)
    return func


def _run(consumer_factory: Callable[[Callable[[ConsumedMessage], None]], Any], printer: _Printer) -> None:
    consumer = consumer_factory(printer)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: printer.stop.set())
    watcher = threading.Thread(target=printer.watch_idle, daemon=True)
    watcher.start()
    consumer.run(printer.stop)
    printer.stop.set()
    watcher.join()


@click.group()
def consume() -> None:
    """Consume with RocketMQ semantics (orderly or concurrently, tag subscriptions)."""


@consume.command("orderly")
@_options
def orderly(**kwargs: Any) -> None:
    """One worker per partition, messages in offset order."""
    one_line_errors(_consume)("orderly", **kwargs)


@consume.command("concurrent")
@_options
def concurrent(**kwargs: Any) -> None:
    """A worker pool; failures go through the group's retry topic."""
    one_line_errors(_consume)("concurrent", **kwargs)


def _consume(
    kind: str,
    *,
    bootstrap: str | None,
    client: ClientConfig,
    topics: tuple[str, ...],
    group: str,
    subscription: str,
    namespace: str,
    max_messages: int,
    idle_exit: float,
) -> None:
    from txbridge.consumer.concurrent import ConcurrentConsumer
    from txbridge.consumer.orderly import OrderlyConsumer
    from txbridge.consumer.tags import parse_subscription

    parse_subscription(subscription)  # a typo fails before any connection
    bootstrap = resolve_bootstrap(bootstrap, client=client)
    printer = _Printer(threading.Event(), max_messages, idle_exit)

    def make(show: Callable[[ConsumedMessage], None]) -> Any:
        if kind == "orderly":

            def orderly_listener(message: ConsumedMessage, _context: Any) -> ConsumeOrderlyStatus:
                show(message)
                return ConsumeOrderlyStatus.SUCCESS

            return OrderlyConsumer(
                bootstrap,
                group,
                list(topics),
                orderly_listener,
                subscription=subscription,
                namespace=namespace,
                client_config=client,
            )

        def concurrent_listener(message: ConsumedMessage, _context: Any) -> ConsumeConcurrentlyStatus:
            show(message)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        return ConcurrentConsumer(
            bootstrap,
            group,
            list(topics),
            concurrent_listener,
            subscription=subscription,
            namespace=namespace,
            client_config=client,
        )

    _run(make, printer)
