package fencetest

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
)

// Acquired is the result of a lease's or a permit's Acquire run in a goroutine of its own by
// AcquireAsync or PermitAsync, with the time it came back.
type Acquired struct {
	Lease *fencelock.Lease
	Err   error
	At    time.Time
}

// AcquireAsync runs l.Acquire(ctx, name, ttl) in a goroutine; the result arrives on the
// channel (buffered: nobody has to read it).
func AcquireAsync(ctx context.Context, l *fencelock.Lessor, name string, ttl time.Duration) <-chan Acquired {
	return testkit.Async(func() Acquired {
		lease, err := l.Acquire(ctx, name, ttl)
		return Acquired{lease, err, time.Now()}
	})
}

// PermitAsync runs s.Acquire(ctx, ttl) in a goroutine; the result arrives on the channel
// (buffered: nobody has to read it).
func PermitAsync(ctx context.Context, s *fencelock.Semaphore, ttl time.Duration) <-chan Acquired {
	return testkit.Async(func() Acquired {
		p, err := s.Acquire(ctx, ttl)
		return Acquired{p, err, time.Now()}
	})
}

// Receive waits for an Acquire's result, failing the test after limit.
func Receive(t testing.TB, ch <-chan Acquired, limit time.Duration) Acquired {
	t.Helper()
	return testkit.Receive(t, ch, limit, "grant")
}
