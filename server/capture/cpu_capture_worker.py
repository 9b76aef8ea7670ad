"""vLLM's CPU worker with activation capture (`--worker-cls` on the CPU build)."""

from vllm.v1.worker.cpu_worker import CPUWorker

from server.capture.capture_worker import LensCaptureMixin


class CPUCaptureWorker(LensCaptureMixin, CPUWorker):
    pass
