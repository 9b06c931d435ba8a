"""SyncBN semantics on the CPU for multi-process tests.

torch's SyncBatchNorm refuses CPU tensors (its kernel, aten::batch_norm_stats, has no CPU
implementation) and mmcv's is a CUDA op.
"""
import torch
import torch.nn as nn


class _SumOverRanks(torch.autograd.Function):
    """all_reduce(SUM) whose backward sums the gradients over the ranks, as SyncBN's does."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class SyncBatchNorm(nn.BatchNorm2d):
    """torch's SyncBatchNorm on the CPU.

    Batch statistics over every rank, differentiable (the backward sums over the ranks, as torch's
    does). Named as torch's and mmcv's classes (what name-based SyncBN checks see), but not an
    ``nn.SyncBatchNorm``, which DDP refuses on the CPU. ``collectives`` counts its synchronised
    forwards.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        if not self.training:
            return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                            self.bias, False, 0., self.eps)
        all_reduce = _SumOverRanks.apply
        self.collectives = getattr(self, 'collectives', 0) + 1
        dims = [0, *range(2, x.dim())]
        count = torch.tensor(float(x.numel() // x.shape[1]))
        dist.all_reduce(count)
        mean = all_reduce(x.sum(dims)) / count
        var = all_reduce((x * x).sum(dims)) / count - mean * mean
        with torch.no_grad():
            m = self.momentum
            self.num_batches_tracked.add_(1)
            self.running_mean.mul_(1 - m).add_(m * mean)
            self.running_var.mul_(1 - m).add_(m * var * count / (count - 1))
        shape = (1, -1) + (1, ) * (x.dim() - 2)
        return ((x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
                * self.weight.view(shape) + self.bias.view(shape))


def convert_to_cpu_sync_bn(module: nn.Module) -> nn.Module:
    """``module`` with every BatchNorm2d replaced by a :class:`SyncBatchNorm` of the same state.

    What mmengine's ``sync_bn='torch'`` does on GPUs.
    """
    for name, child in module.named_children():
        if type(child) is nn.BatchNorm2d:
            sync = SyncBatchNorm(child.num_features, child.eps, child.momentum, child.affine)
            sync.load_state_dict(child.state_dict())
            sync.train(child.training)
            setattr(module, name, sync)
        else:
            convert_to_cpu_sync_bn(child)
    return module
