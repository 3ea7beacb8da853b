package fencelock

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// A grant ends once: the first cause wins, Done closes with it, later ends change nothing.
func TestGrantEndsOnce(t *testing.T) {
	g := newGrantEnd()
	require.NoError(t, g.cause())
	first, second := errors.New("first"), errors.New("second")
	require.True(t, g.finish(first))
	require.False(t, g.finish(second))
	require.Same(t, first, g.cause())
	select {
	case <-g.done:
	default:
		t.Fatal("Done is open after finish")
	}
}

// An advisory lock's one end path: Done closes, the session is settled by the call that ended
// the lock only, and the lock leaves the locker's held set; a second end (an Unlock racing a
// watchdog loss) neither settles the session again nor changes the cause. No server: settle
// never touches the connection here.
func TestAdvisoryLockEndSettlesOnce(t *testing.T) {
	cfg := advisoryConfig{clock: newManualClock(), watchdog: time.Second}
	a := &AdvisoryLocker{cfg: cfg, held: map[AdvisoryKey]*heldEntry{}}
	a.watchdog = newLoop(cfg.clock, a.watchdogRound)
	lk := &AdvisoryLock{locker: a, key: Int64Key(1), conn: &pgxpool.Conn{}, ending: newGrantEnd()}
	a.held[lk.key] = &heldEntry{lock: lk}

	settled := 0
	ended, ran := lk.end(ErrUnlocked, func(*pgxpool.Conn) { settled++ })
	require.True(t, ended)
	require.True(t, ran)
	ended, ran = lk.end(errors.New("lost"), func(*pgxpool.Conn) { settled++ })
	require.False(t, ended)
	require.False(t, ran)
	require.Equal(t, 1, settled)
	require.ErrorIs(t, lk.Err(), ErrUnlocked)
	require.Nil(t, lk.conn)
	require.Empty(t, a.held, "the ended lock is still in the locker's held set")
}
