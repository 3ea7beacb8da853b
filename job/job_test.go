package job

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// unreachableLessor returns a lessor on a pool that cannot connect (nothing listens on port 1):
// a call that ran SQL on it would fail with a connection error, not an ArgumentError.
var unreachableLessor = fencetest.UnreachableLessor

// Job options are typed as the constructors' are: each satisfies package job's Option only, so
// passing one to another constructor does not compile, nor does passing another constructor's
// option to New (it moved here, with the options, from the root's TestLockAndJobOptionsTyped).
func TestOptionsTyped(t *testing.T) {
	is := func(o any) (lessor, advisory, lock, job bool) {
		_, lessor = o.(fencelock.LessorOption)
		_, advisory = o.(fencelock.AdvisoryOption)
		_, lock = o.(fencelock.LockOption)
		_, job = o.(Option)
		return
	}
	for _, tc := range []struct {
		desc                        string
		opt                         any
		lessor, advisory, lock, job bool
	}{
		{"Shared", fencelock.Shared, false, false, true, false},
		{"Exclusive", fencelock.Exclusive, false, false, true, false},
		{"AtKey", fencelock.AtKey(fencelock.Int64Key(1)), false, false, true, false},
		{"WithOverlapWait", WithOverlapWait(), false, false, false, true},
		{"WithHoldAtLeast", WithHoldAtLeast(time.Second), false, false, false, true},
		{"WithRetryCrashed", WithRetryCrashed(), false, false, false, true},
		{"WithRetryFailed", WithRetryFailed(), false, false, false, true},
		{"WithMaxSessionLocks", fencelock.WithMaxSessionLocks(1), false, true, false, false},
		{"WithLogger", fencelock.WithLogger(nil), true, true, false, false},
	} {
		lessor, advisory, lock, job := is(tc.opt)
		require.Equal(t, []bool{tc.lessor, tc.advisory, tc.lock, tc.job}, []bool{lessor, advisory, lock, job}, tc.desc)
	}
}

// Options resolve into the job's configuration, in order.
func TestOptionsResolve(t *testing.T) {
	l := unreachableLessor(t)
	for _, tc := range []struct {
		desc string
		opts []Option
		want config
	}{
		{"Defaults", nil, config{}},
		{"OverlapWait", []Option{WithOverlapWait()}, config{wait: true}},
		{"HoldAtLeast", []Option{WithHoldAtLeast(time.Second)}, config{holdAtLeast: time.Second}},
		{"HoldAtLeastZero", []Option{WithHoldAtLeast(0)}, config{}},
		{"LastHoldWins", []Option{WithHoldAtLeast(time.Second), WithHoldAtLeast(time.Minute)}, config{holdAtLeast: time.Minute}},
		{"Retries", []Option{WithRetryCrashed(), WithRetryFailed()}, config{retryCrashed: true, retryFailed: true}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			j, err := New(l, "job", 10*time.Second, tc.opts...)
			require.NoError(t, err)
			require.Equal(t, tc.want, j.cfg)
			require.Equal(t, l.Holder(), j.holder)
			require.Same(t, l.Pool(), j.pool)
		})
	}
}

// New refuses bad input with an ArgumentError naming it; no SQL runs.
func TestNewRefusesBadInput(t *testing.T) {
	for _, tc := range fencetest.BadLeaseArgs(t, "job") {
		t.Run(tc.Desc, func(t *testing.T) {
			j, err := New(tc.Lessor, tc.Name, tc.TTL)
			require.Nil(t, j)
			fencetest.RequireArgError(t, err, tc.Arg)
		})
	}
	l := unreachableLessor(t)
	for _, tc := range []struct {
		desc string
		opts []Option
		arg  string
	}{
		{"NegativeHoldAtLeast", []Option{WithHoldAtLeast(-time.Second)}, "WithHoldAtLeast"},
		{"NilOption", []Option{WithOverlapWait(), nil}, "option"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			j, err := New(l, "job", 10*time.Second, tc.opts...)
			require.Nil(t, j)
			fencetest.RequireArgError(t, err, tc.arg)
		})
	}
}

// RunSlot and Every refuse bad input with an ArgumentError before any SQL: the lessor's pool
// cannot connect, so a statement would have failed otherwise.
func TestRunRefusesBadInputBeforeSQL(t *testing.T) {
	j, err := New(unreachableLessor(t), "job", 10*time.Second)
	require.NoError(t, err)
	fn := func(context.Context, *Run) error { return errors.New("fn must not run") }
	ctx := context.Background()
	for _, tc := range []struct {
		desc string
		call func() error
		arg  string
	}{
		{"RunSlotNilFn", func() error { return j.RunSlot(ctx, time.Now(), nil) }, "fn"},
		{"EveryNilFn", func() error { return j.Every(ctx, time.Second, nil, nil) }, "fn"},
		{"EveryZero", func() error { return j.Every(ctx, 0, fn, nil) }, "every"},
		{"EveryNegative", func() error { return j.Every(ctx, -time.Second, fn, nil) }, "every"},
		{"EveryUnderMillisecond", func() error { return j.Every(ctx, 999*time.Microsecond, fn, nil) }, "every"},
		{"EveryNotWholeMicroseconds", func() error { return j.Every(ctx, time.Second+time.Nanosecond, fn, nil) }, "every"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			err := tc.call()
			fencetest.RequireArgError(t, err, tc.arg)
		})
	}
}

// Errors of RunSlot before its claim are marked unclaimed (Every tries the slot again) and
// keep what they wrap.
func TestUnclaimedWraps(t *testing.T) {
	err := error(&errUnclaimed{ErrSlotBusy})
	require.ErrorIs(t, err, ErrSlotBusy)
	require.Equal(t, ErrSlotBusy.Error(), err.Error())
}
