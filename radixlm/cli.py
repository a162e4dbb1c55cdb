"""`radixlm` command line. Server arguments are generated from the ServerArgs dataclass."""
from __future__ import annotations

import argparse
import json
import logging
import sys

from radixlm.runtime.args import ServerArgs, add_server_args, server_args_from

__all__ = ["add_server_args", "build_parser", "main", "server_args_from"]


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
    args = _server_args(ns)
    if args.node_rank > 0:
        from radixlm.runtime.launch import serve_worker_node

        serve_worker_node(args)  # this host's ranks only: requests arrive on node 0
        return
    from radixlm.runtime.launch import start_child_server

    start_child_server()  # its imports run while this process imports the HTTP stack
    from radixlm.runtime.server.http_app import serve

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


def build_parser() -> argparse.ArgumentParser:
    from radixlm.router.args import add_router_args

    fmt = argparse.ArgumentDefaultsHelpFormatter
    parser = argparse.ArgumentParser(prog="radixlm", description="radixlm: an LM-program language, an inference "
                                     "server with RadixAttention, and a cache-aware router")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="run one offline generation and print it", formatter_class=fmt)
    gen.add_argument("prompt", nargs="?", default="What is the capital of France?", help="the prompt")
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True, help="apply the chat template")
    gen.add_argument("--max-new-tokens", type=int, default=64, help="most tokens to generate")
    gen.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0: greedy")
    gen.add_argument("--stream", action="store_true", help="print the text as it is generated")
    gen.add_argument("--verbose", action="store_true", help="also print the response's meta_info to stderr")
    add_server_args(gen)
    srv = sub.add_parser("serve", help="serve the native and OpenAI-compatible HTTP APIs "
                         "(also: python -m radixlm.launch_server)", formatter_class=fmt)
    srv.add_argument("--host", default="127.0.0.1", help="address the HTTP server binds")
    srv.add_argument("--port", type=int, default=30000, help="port the HTTP server listens on")
    srv.add_argument("--router-policy", default="cache_aware", help="the router's policy when --dp-size > 1")
    add_server_args(srv)
    add_router_args(sub.add_parser("router", help="route requests over several workers (cache-aware by default)",
                                   formatter_class=fmt))
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
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
