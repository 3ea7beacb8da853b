package fencetest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
)

// FastBackoff keeps waits short in tests where many waiters contend: 200 us doubling to 5 ms.
var FastBackoff = fencelock.WithBackoff(fencelock.ExponentialBackoff(200*time.Microsecond, 5*time.Millisecond))

// NewLessor returns a lessor on pool with holder id holder and opts, failing the test on error.
func NewLessor(t testing.TB, pool *pgxpool.Pool, holder string, opts ...fencelock.LessorOption) *fencelock.Lessor {
	t.Helper()
	l, err := fencelock.NewLessor(pool, append([]fencelock.LessorOption{fencelock.WithHolder(holder)}, opts...)...)
	require.NoError(t, err)
	return l
}

// UnreachableLessor returns a lessor with opts on [testkit.UnreachablePool]: a call that ran
// SQL on it would fail with a connection error, not an argument error.
func UnreachableLessor(t testing.TB, opts ...fencelock.LessorOption) *fencelock.Lessor {
	t.Helper()
	l, err := fencelock.NewLessor(testkit.UnreachablePool(t), opts...)
	require.NoError(t, err)
	return l
}

// WaitDone waits for lease's Done channel, failing the test after limit.
func WaitDone(t testing.TB, lease *fencelock.Lease, limit time.Duration) {
	t.Helper()
	select {
	case <-lease.Done():
	case <-time.After(limit):
		t.Fatalf("lease %q: Done not closed within %v", lease.Name(), limit)
	}
}

// RequireFree fails the test unless another lessor on pool (holder id "other") is granted
// lease name at once (TryAcquire), then releases that grant.
func RequireFree(t testing.TB, ctx context.Context, pool *pgxpool.Pool, name string) {
	t.Helper()
	other, err := NewLessor(t, pool, "other").TryAcquire(ctx, name, 10*time.Second)
	require.NoError(t, err, "lease %q is not free", name)
	require.NoError(t, other.Release(ctx))
}

// RequireArgError checks that err is bad input for argument arg: it matches
// fencelock.ErrInvalidArgument and holds a *fencelock.ArgumentError naming arg.
func RequireArgError(t testing.TB, err error, arg string) {
	t.Helper()
	var ae *fencelock.ArgumentError
	require.ErrorAs(t, err, &ae)
	require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
	require.Equal(t, arg, ae.Arg)
}

// ErrorsAsStale returns the *fencelock.StaleTokenError in err, failing the test unless there is
// one and err matches fencelock.ErrStaleToken.
func ErrorsAsStale(t testing.TB, err error) *fencelock.StaleTokenError {
	t.Helper()
	var stale *fencelock.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.ErrorIs(t, err, fencelock.ErrStaleToken)
	return stale
}

// LeaseArgCase is bad input for a constructor that takes a lessor, a lease name and a TTL
// (job.New, gooselock.New): the case's name, the arguments, and the argument its
// *fencelock.ArgumentError must name.
type LeaseArgCase struct {
	Desc   string
	Lessor *fencelock.Lessor
	Name   string
	TTL    time.Duration
	Arg    string
}

// BadLeaseArgs returns the cases every such constructor refuses before any SQL, on lessors of
// [UnreachableLessor], with name where the name is fine: a nil lessor; an empty, overlong,
// NUL-holding or invalid UTF-8 name; a zero TTL, one under fencelock.MinTTL and one over
// fencelock.MaxTTL; and a TTL that leaves its lessor's heartbeat interval (5 s) no room.
func BadLeaseArgs(t testing.TB, name string) []LeaseArgCase {
	t.Helper()
	l := UnreachableLessor(t)
	noHeartbeatRoom := UnreachableLessor(t, fencelock.WithHeartbeatInterval(5*time.Second))
	return []LeaseArgCase{
		{"NilLessor", nil, name, 10 * time.Second, "lessor"},
		{"EmptyName", l, "", 10 * time.Second, "name"},
		{"OverlongName", l, string(make([]byte, fencelock.MaxNameLength+1)), 10 * time.Second, "name"},
		{"NulInName", l, name + "\x00", 10 * time.Second, "name"},
		{"InvalidUTF8Name", l, name + "\xff", 10 * time.Second, "name"},
		{"ZeroTTL", l, name, 0, "ttl"},
		{"TTLUnderMin", l, name, fencelock.MinTTL - time.Nanosecond, "ttl"},
		{"TTLOverMax", l, name, fencelock.MaxTTL + time.Second, "ttl"},
		{"TTLWithoutHeartbeatRoom", noHeartbeatRoom, name, 5 * time.Second, "WithHeartbeatInterval"},
	}
}
