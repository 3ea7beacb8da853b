package integration

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkMultiLock: TryAcquireAll of n names and the set's release (n + 1 statements),
// beside n TryAcquire + Release of the same names one by one (2n statements), for n = 1, 5, 20.
func BenchmarkMultiLock(b *testing.B) {
	for _, n := range []int{1, 5, 20} {
		b.Run(fmt.Sprint("Names", n), func(b *testing.B) {
			e := benchSetup(b)
			l := benchLessor(b, e.pool)
			names := make([]string, n)
			for i := range names {
				names[i] = fmt.Sprint("multi:", i)
			}
			ratio(b, func() error {
				set, err := l.TryAcquireAll(e.ctx, names, time.Minute)
				if err != nil {
					return err
				}
				return set.Release(e.ctx)
			}, func() error {
				for _, name := range names {
					lease, err := l.TryAcquire(e.ctx, name, time.Minute)
					if err != nil {
						return err
					}
					if err := lease.Release(e.ctx); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}
