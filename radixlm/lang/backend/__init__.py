"""Backends the interpreter talks to: RuntimeEndpoint (a radixlm/SGLang server), OpenAI, Anthropic."""
