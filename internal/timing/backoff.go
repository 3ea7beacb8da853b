package timing

import (
	"math/rand/v2"
	"time"
)

// Exponential returns a backoff that waits min * 2^attempt before retry number attempt (0 for
// the first retry), capped at max, with "equal jitter": a uniform random wait in [d/2, d], so
// waiters that started together spread out. The caller has checked 0 < min <= max. The result
// is stateless and safe for concurrent use.
func Exponential(min, max time.Duration) func(attempt int) time.Duration {
	return func(attempt int) time.Duration {
		d := max
		if attempt < 62 && min<<attempt > 0 && min<<attempt < max {
			d = min << attempt
		}
		return d/2 + rand.N(d/2+1)
	}
}
