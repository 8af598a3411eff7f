package ctrd

import "github.com/gauntlet-rl/gauntlet/pkg/sandbox"

// Resource faults change a containerd sandbox's limits while it runs (UpdateLimits).
// Clock skew is not offered: the base image's busybox is static, so LD_PRELOAD-based
// skewing cannot reach it.
var _ sandbox.LimitUpdater = (*Runtime)(nil)
