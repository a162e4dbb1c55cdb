"""`radixlm` command line. Server arguments are generated from the ServerArgs dataclass."""
from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import logging
import sys
import types
import typing

from radixlm.runtime.args import ServerArgs


def _base_type(tp):
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = [a for a in typing.get_args(tp) if a is not type(None)][0]
    return str if isinstance(tp, type) and issubclass(tp, enum.Enum) else tp  # ServerArgs makes members of them


def add_server_args(parser: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(ServerArgs)
    for f in dataclasses.fields(ServerArgs):
        flag = "--" + f.name.replace("_", "-")
        tp = _base_type(hints[f.name])
        # An enum default goes in as its value: argparse would pass a str-mixin member through str() (the name).
        default = f.default.value if isinstance(f.default, enum.Enum) else f.default
        kw = {"default": default, "help": f.metadata.get("help", "")}
        if tp is bool:
            parser.add_argument(flag, action="store_true", **kw)
        elif typing.get_origin(tp) is list:
            parser.add_argument(flag, nargs="+", type=typing.get_args(tp)[0], **kw)
        else:
            parser.add_argument(flag, type=tp, choices=f.metadata.get("choices"), **kw)


def server_args_from(ns: argparse.Namespace) -> dict:
    return {f.name: getattr(ns, f.name) for f in dataclasses.fields(ServerArgs)}


def cmd_generate(ns: argparse.Namespace) -> None:
    from radixlm.runtime.engine import Engine

    engine = Engine(**server_args_from(ns))
    try:
        prompt = ns.prompt
        if ns.chat:
            prompt = engine.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        sp = {"max_new_tokens": ns.max_new_tokens, "temperature": ns.temperature}
        if ns.stream:
            shown = 0
            for chunk in engine.generate(prompt, sp, stream=True):
                sys.stdout.write(chunk["text"][shown:])
                sys.stdout.flush()
                shown = len(chunk["text"])
            print()
        else:
            out = engine.generate(prompt, sp)
            print(out["text"])
            if ns.verbose:
                print(json.dumps(out["meta_info"], indent=2), file=sys.stderr)
    finally:
        engine.shutdown()


def cmd_serve(ns: argparse.Namespace) -> None:
    if ns.dp_size > 1:
        from radixlm.router.args import RouterArgs
        from radixlm.router.launch import serve_data_parallel

        try:
            router_args = RouterArgs(host=ns.host, port=ns.port, policy=ns.router_policy, log_level=ns.log_level)
        except ValueError as e:
            sys.exit(f"radixlm serve: error: --router-policy: {e}")
        serve_data_parallel(_server_args(ns), ns.dp_size, router_args)
        return
    from radixlm.runtime.server.http_app import serve

    args = _server_args(ns)
    if args.node_rank > 0:
        from radixlm.runtime.launch import serve_worker_node

        serve_worker_node(args)  # this host's ranks only: requests arrive on node 0
        return
    serve(args, host=ns.host, port=ns.port)


def _server_args(ns: argparse.Namespace) -> ServerArgs:
    try:
        return ServerArgs(**server_args_from(ns))
    except ValueError as e:
        print(f"radixlm {ns.command}: error: {e}", file=sys.stderr)
        sys.exit(2)


def cmd_router(ns: argparse.Namespace) -> None:
    from radixlm.router.args import router_args_from
    from radixlm.router.launch import run_router

    try:
        args = router_args_from(ns)
    except ValueError as e:
        sys.exit(f"radixlm router: error: {e}")
    run_router(args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="radixlm")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="run one offline generation and print it")
    gen.add_argument("prompt", nargs="?", default="What is the capital of France?")
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True, help="apply the chat template")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--stream", action="store_true")
    gen.add_argument("--verbose", action="store_true")
    add_server_args(gen)
    srv = sub.add_parser("serve", help="serve the native HTTP API (also: python -m radixlm.launch_server)")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=30000)
    srv.add_argument("--router-policy", default="cache_aware", help="the router's policy when --dp-size > 1")
    add_server_args(srv)
    from radixlm.router.args import add_router_args

    add_router_args(sub.add_parser("router", help="route requests over several workers (cache-aware by default)"))
    ns = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, ns.log_level.upper(), logging.INFO), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if ns.command == "generate":
        cmd_generate(ns)
    elif ns.command == "serve":
        cmd_serve(ns)
    elif ns.command == "router":
        cmd_router(ns)


if __name__ == "__main__":
    main()
