package testkit

import (
	"context"
	"testing"
	"time"
)

// WaitFor polls cond every 5 ms until it holds, failing the test with what (a clause: "the
// lease is renewed") when ctx ends first.
func WaitFor(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting until %s", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// await polls check every period until it reports done, failing the test with check's last
// report once limit has passed.
func await(t testing.TB, limit, period time.Duration, check func() (done bool, report string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		done, report := check()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(report)
		}
		time.Sleep(period)
	}
}

// Async runs f in a goroutine of its own and delivers its result on a channel with room for
// it, so the goroutine ends even if nobody receives.
func Async[T any](f func() T) <-chan T {
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	return ch
}

// Receive returns the value ch delivers, failing the test with "no <what> within <limit>"
// when none comes within limit.
func Receive[T any](t testing.TB, ch <-chan T, limit time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(limit):
		t.Fatalf("no %s within %v", what, limit)
		var zero T
		return zero
	}
}
