"""Overrides that make a ``vitlab fit`` on the digits take a second or two, shared by the end-to-end tests."""

TINY = [
    "trainer.enable_progress_bar=false",
    "trainer.accelerator=cpu",
    "model.depth=1",
    "data.limit_train=256",
    "run.generate=false",
    "run.report=false",
]
