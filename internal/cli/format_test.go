package cli

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

func TestFormatDuration(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0ms"},
		{0, "0ms"},
		{850 * time.Millisecond, "850ms"},
		{999*time.Millisecond + 600*time.Microsecond, "1.0s"},
		{4249 * time.Millisecond, "4.2s"},
		{4250 * time.Millisecond, "4.3s"},
		{59960 * time.Millisecond, "1m00s"},
		{3*time.Minute + 5*time.Second, "3m05s"},
		{59*time.Minute + 59*time.Second + 600*time.Millisecond, "1h00m"},
		{2*time.Hour + time.Minute + 10*time.Second, "2h01m"},
		{23*time.Hour + 59*time.Minute + 31*time.Second, "1d00h"},
		{76 * time.Hour, "3d04h"},
	} {
		require.Equal(t, tc.want, formatDuration(tc.d), "%v", tc.d)
	}
}

func TestLockCells(t *testing.T) {
	for _, tc := range []struct {
		name string
		row  lockRow
		want []string
	}{
		{"LeaseWithWaiter", lockRow{Kind: "lease", Resource: "payment:42", Holder: "worker-1", Token: ptr(int64(131)),
			ttlLeft: ptr(4200 * time.Millisecond), Heartbeat: "ok", Renewals: ptr(int64(3)), heldFor: ptr(185 * time.Second),
			Waiters: 1, NextHolder: ptr("worker-2")},
			[]string{"lease", "payment:42", "worker-1", "131", "4.2s", "ok (3 renewals)", "3m05s", "1 (next: worker-2)"}},
		{"LeaseOneRenewal", lockRow{Kind: "lease", Resource: "a\tb", Holder: "h", Token: ptr(int64(7)),
			ttlLeft: ptr(850 * time.Millisecond), Heartbeat: "late", Renewals: ptr(int64(1)), heldFor: ptr(time.Second)},
			[]string{"lease", `"a\tb"`, "h", "7", "850ms", "late (1 renewal)", "1.0s", "0"}},
		{"AdvisoryIdle", lockRow{Kind: "advisory", Resource: "key 1,2", Holder: "pid 12", Heartbeat: "session", Waiters: 2},
			[]string{"advisory", "key 1,2", "pid 12", "-", "-", "session", "-", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, lockCells(tc.row))
		})
	}
}

// Rows of fencelock.advisory_locks fold into one row per holder, with the waiters of its key
// counted, or the first waiter when nobody holds the key; a prepared transaction has no pid.
func TestGroupAdvisory(t *testing.T) {
	yes, no := true, false
	rows := []lockRow{
		{Kind: "advisory", Resource: "report", Key: ptr(int64(5)), Mode: "exclusive", Granted: &yes, PID: ptr(int32(10)), ClientAddr: ptr("10.0.0.1")},
		{Kind: "advisory", Resource: "report", Key: ptr(int64(5)), Mode: "exclusive", Granted: &no, PID: ptr(int32(11)), BlockedBy: []int32{10}},
		{Kind: "advisory", Resource: "report", Key: ptr(int64(5)), Mode: "exclusive", Granted: &no, PID: ptr(int32(12)), BlockedBy: []int32{10, 11}},
		{Kind: "advisory", Resource: "key 1,2", Key1: ptr(int32(1)), Key2: ptr(int32(2)), Mode: "shared", Granted: &yes, PID: ptr(int32(20))},
		{Kind: "advisory", Resource: "key 1,2", Key1: ptr(int32(1)), Key2: ptr(int32(2)), Mode: "shared", Granted: &yes, PID: ptr(int32(21))},
		{Kind: "advisory", Resource: "key 9", Key: ptr(int64(9)), Mode: "exclusive", Granted: &no, PID: ptr(int32(30)), BlockedBy: []int32{3, 4}},
		{Kind: "advisory", Resource: "key 9", Key: ptr(int64(9)), Mode: "exclusive", Granted: &no, PID: ptr(int32(31))},
		{Kind: "advisory", Resource: "key 3", Key: ptr(int64(3)), Mode: "exclusive", Granted: &yes}, // a prepared transaction
	}
	type view struct {
		Resource, Holder, Heartbeat string
		Waiters                     int64
		WaitingPIDs                 []int32
	}
	var got []view
	for _, r := range groupAdvisory(rows) {
		got = append(got, view{r.Resource, r.Holder, r.Heartbeat, r.Waiters, r.WaitingPIDs})
	}
	require.Equal(t, []view{
		{"report", "pid 10 (10.0.0.1)", "session", 2, []int32{11, 12}},
		{"key 1,2", "pid 20", "session (shared)", 0, nil},
		{"key 1,2", "pid 21", "session (shared)", 0, nil},
		{"key 9", "pid 30 (waiting, blocked by 3,4)", "waiting", 1, []int32{31}},
		{"key 3", "prepared transaction", "prepared", 0, nil},
	}, got)
}

// A key is read as a key, anything else as a name, hashed to the key an AdvisoryLocker of the
// namespace takes for it.
func TestParseAdvisoryArg(t *testing.T) {
	// No connection is made: the pool connects on first use.
	pool, err := pgxpool.New(context.Background(), "postgres://localhost/unused")
	require.NoError(t, err)
	defer pool.Close()
	lockerKey := func(ns, name string) string {
		a, err := fencelock.NewAdvisoryLocker(pool, fencelock.WithNamespace(ns))
		require.NoError(t, err)
		k, err := a.Key(name)
		require.NoError(t, err)
		return k.String()
	}
	for _, tc := range []struct {
		arg, namespace string
		want           string
	}{
		{"123", "fencelock", "advisory key 123"},
		{"-9223372036854775808", "fencelock", "advisory key -9223372036854775808"},
		{"1,2", "fencelock", "advisory key 1,2"},
		{"-1, 7", "fencelock", "advisory key -1,7"},
		{"nightly-report", "fencelock", `advisory lock "nightly-report" (key ` + lockerKey("fencelock", "nightly-report") + ")"},
		{"nightly-report", "billing", `advisory lock "nightly-report" (key ` + lockerKey("billing", "nightly-report") + ")"},
		{"1,99999999999", "fencelock", `advisory lock "1,99999999999" (key ` + lockerKey("fencelock", "1,99999999999") + ")"},
	} {
		a, err := parseAdvisoryArg(tc.arg, tc.namespace)
		require.NoError(t, err)
		require.Equal(t, tc.want, a.String())
	}
}

func TestDescribeRelease(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  releaseResult
		want string
	}{
		{"HandedOver", releaseResult{Lease: "payment:42", OldHolder: ptr("worker-1"), OldToken: ptr(int64(131)), NewToken: ptr(int64(140)),
			HandedTo: ptr("worker-2"), Fenced: []string{"payment:42", "ledger"}, Held: true},
			`released lease "payment:42" held by worker-1 (token 131); fenced with token 140 (payment:42, ledger); handed to worker-2`},
		{"NobodyWaited", releaseResult{Lease: "x", OldHolder: ptr("h"), OldToken: ptr(int64(3)), NewToken: ptr(int64(4)), Fenced: []string{"x"}, Held: true},
			`released lease "x" held by h (token 3); fenced with token 4 (x); nobody waited`},
		{"WokeTransactionScopedWaiter", releaseResult{Lease: "x", OldHolder: ptr("h"), OldToken: ptr(int64(3)), NewToken: ptr(int64(4)), Waiting: 1,
			Fenced: []string{"x"}, Held: true},
			`released lease "x" held by h (token 3); fenced with token 4 (x); woke the next waiter to take it`},
		{"NotHeld", releaseResult{Lease: "x", NewToken: ptr(int64(9)), Fenced: []string{"x"}},
			`lease "x" was not held; fenced with token 9 (x)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, describeRelease(tc.res))
		})
	}
}
