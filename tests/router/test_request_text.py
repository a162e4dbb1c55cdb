from radixlm.router.request_text import routing_text


def test_generate_text_batch_and_ids():
    assert routing_text("/generate", {"text": "hello"}) == "hello"
    assert routing_text("/generate", {"text": ["first", "second"]}) == "first"
    a = routing_text("/generate", {"input_ids": [1, 2, 3]})
    b = routing_text("/generate", {"input_ids": [[1, 2, 3, 4]]})
    assert len(a) == 3 and b.startswith(a)
    assert routing_text("/generate", {"input_ids": [-5, "x"]}) == "[-5, 'x']"
    assert routing_text("/generate", {}) == ""


def test_completions_prompt_kinds():
    assert routing_text("/v1/completions", {"prompt": "p"}) == "p"
    assert routing_text("/v1/completions", {"prompt": ["p1", "p2"]}) == "p1"
    assert len(routing_text("/v1/completions", {"prompt": [5, 6]})) == 2


def test_chat_turns_extend_the_text():
    one = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    two = one + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    t1 = routing_text("/v1/chat/completions", {"messages": one})
    assert "be brief" in t1 and "hi" in t1
    assert routing_text("/v1/chat/completions", {"messages": two}).startswith(t1)
    assert routing_text("/v1/chat/completions", {"messages": "not a list"}) == ""


def test_anthropic_system_and_extra_key_namespace():
    t = routing_text("/v1/messages", {"system": "sys", "messages": [{"role": "user", "content": "q"}]})
    assert t.startswith("<system>sys") and t.endswith("q\n")
    plain = routing_text("/generate", {"text": "x"})
    keyed = routing_text("/generate", {"text": "x", "extra_key": "tenant-a"})
    assert keyed != plain and keyed.endswith("x")


def test_responses_instructions_and_input():
    t = routing_text("/v1/responses", {"instructions": "be brief", "input": "hi"})
    assert t == "<system>be brief\nhi"
    items = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    assert routing_text("/v1/responses", {"input": items}) == "<user>hi\n"
    assert routing_text("/v1/responses", {"input": 3}) == ""
