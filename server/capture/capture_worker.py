"""The worker half of activation capture: a mixin over the platform's vLLM worker class.

Passed to vLLM with `--worker-cls` (cpu_capture_worker / gpu_capture_worker put it in front of
`CPUWorker` / `Worker`) and configured by `--additional-config '{"ahc_lens": {...}}'`. A
`--worker-extension-cls` cannot do this: vLLM only lets an extension add methods, and the capture has
to wrap `load_model` (switch the model to expose the lens layer before warm-up) and `execute_model`
(read the stashed forward state before `sample_tokens` consumes it).
"""

from __future__ import annotations

from typing import Any

from server.capture.step_capture import LensSettings, StepCapture


class LensCaptureMixin:
    _ahc_capture: StepCapture | None = None

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)  # type: ignore[misc]
        settings = LensSettings.from_vllm_config(self.vllm_config)  # type: ignore[attr-defined]
        if settings is None:
            return
        if getattr(self, "use_v2_model_runner", False):
            # Model Runner V2 keeps its forward state elsewhere; the hook points below are V1's.
            raise ValueError("lens capture needs vLLM's V1 model runner: set VLLM_USE_V2_MODEL_RUNNER=0")
        self._ahc_capture = StepCapture.attach(self.model_runner, settings, ship=_ships())  # type: ignore[attr-defined]

    def execute_model(self, scheduler_output: Any) -> Any:
        output = super().execute_model(scheduler_output)  # type: ignore[misc]
        # None: the forward ran and its state waits for sample_tokens (the common path).
        if output is None and self._ahc_capture is not None:
            self._ahc_capture.after_forward(self.model_runner)  # type: ignore[attr-defined]
        return output

    def shutdown(self) -> None:
        if self._ahc_capture is not None:
            self._ahc_capture.close()
            self._ahc_capture = None
        super().shutdown()  # type: ignore[misc]


def _ships() -> bool:
    """One worker ships: tensor-parallel ranks hold the same hidden state, and only the last
    pipeline stage has the rows that produce tokens."""
    from vllm.distributed.parallel_state import get_pp_group, get_tp_group

    return get_tp_group().rank_in_group == 0 and get_pp_group().is_last_rank
