from tests.runtime.scheduler.conftest import tiny_model_dir  # noqa: F401 - the fixture, for these tests too
