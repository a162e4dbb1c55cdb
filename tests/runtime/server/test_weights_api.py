"""The weight-update and memory routes on the shared server (SmolLM2, started without --enable-memory-saver): bodies
are checked, refusals answer 400 with SGLang's {success, message} and leave the server serving its weights, and the
weight version is reported. (Successful updates are the Engine's tests: the shared server keeps its weights.)"""
from __future__ import annotations

import pytest

GENERATE = {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 4}}


REFUSED = [
    ("/update_weights_from_disk", {"model_path": "/nonexistent/checkpoint"}, "does not exist"),
    ("/update_weights_from_disk", {"model_path": "default", "load_format": "dummy"}, "load_format"),
    ("/release_memory_occupation", {}, "--enable-memory-saver"),
    ("/resume_memory_occupation", {"tags": ["weights"]}, "--enable-memory-saver"),
    ("/update_weights_from_distributed", {"names": ["lm_head.weight"], "dtypes": ["float32"], "shapes": [[2, 2]]},
     "no weights-update group"),
    ("/destroy_weights_update_group", {}, "no weights-update group"),
    ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1,
                                    "world_size": 2, "backend": "mpi"}, "unknown backend"),
]


def test_refused_requests_answer_400_and_change_nothing(server):
    before = server.client.post("/generate", json=GENERATE).json()["text"]
    for path, body, expected in REFUSED:
        r = server.client.post(path, json=body)
        assert r.status_code == 400, (path, r.text)
        out = r.json()
        assert out["success"] is False and expected in out["message"], (path, out)
        assert out["weight_version"] == "default"
    assert server.client.post("/generate", json=GENERATE).json()["text"] == before


@pytest.mark.parametrize("path,body", [
    ("/update_weights_from_disk", {}),
    ("/update_weights_from_disk", {"model_path": "default", "flush": True}),
    ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 0, "rank_offset": 1,
                                    "world_size": 2}),
    ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1,
                                    "world_size": 1}),
    ("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float32"], "shapes": [[-1]]}),
    ("/release_memory_occupation", {"tags": "weights"}),
])
def test_malformed_bodies_are_refused_before_the_scheduler(server, path, body):
    r = server.client.post(path, json=body)
    assert r.status_code == 400, r.text


def test_the_weight_version_is_reported(server):
    assert server.client.get("/get_weight_version").json() == {"weight_version": "default"}
    assert server.client.get("/server_info").json()["weight_version"] == "default"
    assert server.client.get("/model_info").json()["weight_version"] == "default"
