package fencelock_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
)

// unreachablePool is a pool whose every connection attempt fails: pgxpool connects lazily, so a
// call that returns an *ArgumentError through it provably ran no SQL.
var unreachablePool = testkit.UnreachablePool

// noSQLTx is a pgx.Tx that fails the test if any statement is sent through it.
type noSQLTx struct {
	pgx.Tx
	t *testing.T
}

func (x noSQLTx) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	x.t.Error("SQL ran on bad input")
	return pgconn.CommandTag{}, errors.New("no SQL expected")
}

func (x noSQLTx) Query(context.Context, string, ...any) (pgx.Rows, error) {
	x.t.Error("SQL ran on bad input")
	return nil, errors.New("no SQL expected")
}

func (x noSQLTx) QueryRow(context.Context, string, ...any) pgx.Row {
	x.t.Error("SQL ran on bad input")
	return nil
}

// requireArgError checks that err is bad input for argument arg.
var requireArgError = fencetest.RequireArgError

func TestBadInputIsRefusedBeforeSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := unreachablePool(t)
	l, err := fencelock.NewLessor(pool)
	require.NoError(t, err)
	okFn := func(context.Context, pgx.Tx, fencelock.Token) error { return nil }

	t.Run("Names", func(t *testing.T) {
		for _, tc := range []struct{ desc, name string }{
			{"Empty", ""},
			{"OverLong", strings.Repeat("n", fencelock.MaxNameLength+1)},
			{"NUL", "pay\x00ment"},
			{"InvalidUTF8", "pay\xffment"},
		} {
			t.Run(tc.desc, func(t *testing.T) {
				_, err := l.TryAcquire(ctx, tc.name, time.Second)
				requireArgError(t, err, "name")
				_, err = l.Acquire(ctx, tc.name, time.Second)
				requireArgError(t, err, "name")
				requireArgError(t, l.TryRunLocked(ctx, tc.name, okFn), "name")
				requireArgError(t, l.RunLocked(ctx, tc.name, okFn), "name")
				requireArgError(t, fencelock.FenceTx(ctx, noSQLTx{t: t}, tc.name, 1), "resource")
			})
		}
		_, err := l.TryAcquire(ctx, strings.Repeat("n", fencelock.MaxNameLength), time.Second)
		require.NotErrorIs(t, err, fencelock.ErrInvalidArgument, "a name of exactly MaxNameLength bytes is valid")
	})

	t.Run("TTL", func(t *testing.T) {
		for _, ttl := range []time.Duration{0, -time.Second, fencelock.MinTTL - 1, fencelock.MaxTTL + 1, 1<<63 - 1} {
			_, err := l.TryAcquire(ctx, "job", ttl)
			requireArgError(t, err, "ttl")
			_, err = l.Acquire(ctx, "job", ttl)
			requireArgError(t, err, "ttl")
		}
	})

	t.Run("HeartbeatNotShorterThanTTL", func(t *testing.T) {
		lh, err := fencelock.NewLessor(pool, fencelock.WithHeartbeatInterval(time.Second))
		require.NoError(t, err)
		for _, ttl := range []time.Duration{time.Second, 500 * time.Millisecond, 1050 * time.Millisecond} {
			_, err = lh.TryAcquire(ctx, "job", ttl) // 1050ms less the 105ms margin is < 1s
			requireArgError(t, err, "WithHeartbeatInterval")
		}
		lm, err := fencelock.NewLessor(pool, fencelock.WithSafetyMargin(time.Second))
		require.NoError(t, err)
		_, err = lm.TryAcquire(ctx, "job", time.Second)
		requireArgError(t, err, "WithSafetyMargin")
	})

	t.Run("Options", func(t *testing.T) {
		for _, tc := range []struct {
			arg string
			opt fencelock.LessorOption
		}{
			{"WithHolder", fencelock.WithHolder("")},
			{"WithHolder", fencelock.WithHolder("a\x00b")},
			{"WithHeartbeatInterval", fencelock.WithHeartbeatInterval(0)},
			{"WithHeartbeatInterval", fencelock.WithHeartbeatInterval(-time.Second)},
			{"WithSafetyMargin", fencelock.WithSafetyMargin(-1)},
			{"WithBackoff", fencelock.WithBackoff(nil)},
			{"WithLogger", fencelock.WithLogger((*slog.Logger)(nil))},
			{"option", nil},
		} {
			_, err := fencelock.NewLessor(pool, tc.opt)
			requireArgError(t, err, tc.arg)
		}
		_, err := fencelock.NewLessor(pool, fencelock.WithoutHeartbeat(), fencelock.WithHeartbeatInterval(time.Second))
		requireArgError(t, err, "WithoutHeartbeat")
		_, err = fencelock.NewLessor(nil)
		requireArgError(t, err, "pool")
		requireArgError(t, fencelock.Migrate(ctx, nil), "pool")
	})

	t.Run("Tokens", func(t *testing.T) {
		for _, tok := range []fencelock.Token{0, -1, -1 << 63} {
			requireArgError(t, fencelock.FenceTx(ctx, noSQLTx{t: t}, "r", tok), "token")
			_, err := fencelock.UpdateFencedTx(ctx, noSQLTx{t: t}, pgx.Identifier{"t"}, "tok", tok, nil, []fencelock.Column{{Name: "id", Value: 1}})
			requireArgError(t, err, "token")
		}
	})

	t.Run("NilTxAndFn", func(t *testing.T) {
		requireArgError(t, fencelock.FenceTx(ctx, nil, "r", 1), "tx")
		_, err := fencelock.UpdateFencedTx(ctx, nil, pgx.Identifier{"t"}, "tok", 1, nil, []fencelock.Column{{Name: "id", Value: 1}})
		requireArgError(t, err, "tx")
		requireArgError(t, l.TryRunLocked(ctx, "job", nil), "fn")
		requireArgError(t, l.RunLocked(ctx, "job", nil), "fn")
	})

	t.Run("Identifiers", func(t *testing.T) {
		key := []fencelock.Column{{Name: "id", Value: 1}}
		for _, tc := range []struct {
			desc, arg string
			table     pgx.Identifier
			tokenCol  string
			set, key  []fencelock.Column
		}{
			{"EmptyTable", "table", pgx.Identifier{}, "tok", nil, key},
			{"ThreePartTable", "table", pgx.Identifier{"a", "b", "c"}, "tok", nil, key},
			{"EmptyTablePart", "table", pgx.Identifier{"public", ""}, "tok", nil, key},
			{"OverLongTable", "table", pgx.Identifier{strings.Repeat("t", 64)}, "tok", nil, key},
			{"NULColumn", "tokenColumn", pgx.Identifier{"t"}, "to\x00k", nil, key},
			{"InvalidUTF8Column", "column", pgx.Identifier{"t"}, "tok", []fencelock.Column{{Name: "\xff"}}, key},
			{"NoKey", "key", pgx.Identifier{"t"}, "tok", nil, nil},
			{"TokenColumnInSet", "column", pgx.Identifier{"t"}, "tok", []fencelock.Column{{Name: "tok"}}, key},
		} {
			t.Run(tc.desc, func(t *testing.T) {
				_, err := fencelock.UpdateFencedTx(ctx, noSQLTx{t: t}, tc.table, tc.tokenCol, 1, tc.set, tc.key)
				requireArgError(t, err, tc.arg)
			})
		}
	})
}

func TestAdvisoryBadInputIsRefusedBeforeSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := unreachablePool(t)
	a, err := fencelock.NewAdvisoryLocker(pool)
	require.NoError(t, err)

	for _, tc := range []struct{ desc, name string }{
		{"Empty", ""},
		{"OverLong", strings.Repeat("n", fencelock.MaxNameLength+1)},
		{"NUL", "re\x00port"},
		{"InvalidUTF8", "re\xffport"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := a.TryLock(ctx, tc.name)
			requireArgError(t, err, "name")
			_, err = a.Lock(ctx, tc.name)
			requireArgError(t, err, "name")
			_, err = a.TryLock(ctx, tc.name, fencelock.Shared)
			requireArgError(t, err, "name")
			_, err = a.Lock(ctx, tc.name, fencelock.Shared)
			requireArgError(t, err, "name")
			_, err = a.TryLockTx(ctx, noSQLTx{t: t}, tc.name)
			requireArgError(t, err, "name")
			_, err = a.LockTx(ctx, noSQLTx{t: t}, tc.name, fencelock.Shared)
			requireArgError(t, err, "name")
			_, err = a.Key(tc.name)
			requireArgError(t, err, "name")
		})
	}
	t.Run("NilTx", func(t *testing.T) {
		_, err := a.TryLockTx(ctx, nil, "job")
		requireArgError(t, err, "tx")
		_, err = a.LockTx(ctx, nil, "", fencelock.AtKey(fencelock.Int64Key(1)), fencelock.Exclusive)
		requireArgError(t, err, "tx")
	})
	t.Run("Mode", func(t *testing.T) {
		_, err := a.TryLock(ctx, "", fencelock.AtKey(fencelock.Int64Key(1)), fencelock.LockMode(7))
		requireArgError(t, err, "mode")
		_, err = a.TryLockTx(ctx, noSQLTx{t: t}, "", fencelock.AtKey(fencelock.Int64Key(1)), fencelock.LockMode(-1))
		requireArgError(t, err, "mode")
	})
	t.Run("LockOptions", func(t *testing.T) {
		k1, k2 := fencelock.AtKey(fencelock.Int64Key(1)), fencelock.AtKey(fencelock.Int32PairKey(0, 1))
		for _, tc := range []struct {
			desc, arg, name string
			opts            []fencelock.LockOption
		}{
			{"NilOption", "option", "job", []fencelock.LockOption{nil}},
			{"TwoModes", "mode", "job", []fencelock.LockOption{fencelock.Shared, fencelock.Exclusive}},
			{"TwoKeys", "AtKey", "job", []fencelock.LockOption{k1, k2}},
			{"EmptyNameWithoutKey", "name", "", []fencelock.LockOption{fencelock.Shared}},
			{"BadNameWithKey", "name", "re\x00port", []fencelock.LockOption{k1}},
		} {
			t.Run(tc.desc, func(t *testing.T) {
				_, err := a.TryLock(ctx, tc.name, tc.opts...)
				requireArgError(t, err, tc.arg)
				_, err = a.Lock(ctx, tc.name, tc.opts...)
				requireArgError(t, err, tc.arg)
				_, err = a.TryLockTx(ctx, noSQLTx{t: t}, tc.name, tc.opts...)
				requireArgError(t, err, tc.arg)
				_, err = a.LockTx(ctx, noSQLTx{t: t}, tc.name, tc.opts...)
				requireArgError(t, err, tc.arg)
			})
		}
	})
	t.Run("Options", func(t *testing.T) {
		for _, tc := range []struct {
			arg string
			opt fencelock.AdvisoryOption
		}{
			{"WithNamespace", fencelock.WithNamespace("")},
			{"WithNamespace", fencelock.WithNamespace("\xff")},
			{"WithKeyHash", fencelock.WithKeyHash(nil)},
			{"WithWatchdogInterval", fencelock.WithWatchdogInterval(time.Millisecond)},
			{"WithMaxSessionLocks", fencelock.WithMaxSessionLocks(0)},
			{"WithLogger", fencelock.WithLogger((*slog.Logger)(nil))},
			{"option", nil},
		} {
			_, err := fencelock.NewAdvisoryLocker(pool, tc.opt)
			requireArgError(t, err, tc.arg)
		}
		_, err := fencelock.NewAdvisoryLocker(nil)
		requireArgError(t, err, "pool")
		// An option of the other constructor does not compile here: TestOptionsTypedPerConstructor.
	})
}
