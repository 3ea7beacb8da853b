package fencelock

import (
	"fmt"
	"time"

	"github.com/fencelock/fencelock/internal/timing"
)

// Backoff returns how long to wait before retry number attempt (0 for the first retry). It
// must be stateless and safe for concurrent use: one Backoff serves every call of a lessor.
type Backoff func(attempt int) time.Duration

// ExponentialBackoff returns a [Backoff] that waits min * 2^attempt, capped at max, with
// "equal jitter": a uniform random wait in [d/2, d], so waiters that started together spread
// out. min and max are positive time.Durations with min <= max; otherwise it panics, as a
// programming error.
func ExponentialBackoff(min, max time.Duration) Backoff {
	if min <= 0 || max < min {
		panic(fmt.Sprintf("fencelock: ExponentialBackoff(%v, %v): need 0 < min <= max", min, max))
	}
	return timing.Exponential(min, max)
}
