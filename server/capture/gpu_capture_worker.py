"""vLLM's GPU worker with activation capture (`--worker-cls` on a GPU)."""

from vllm.v1.worker.gpu_worker import Worker

from server.capture.capture_worker import LensCaptureMixin


class GPUCaptureWorker(LensCaptureMixin, Worker):
    pass
