package fencelock

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/advisory"
	"github.com/fencelock/fencelock/internal/timing"
	"github.com/fencelock/fencelock/internal/timing/timingtest"
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

// newTestLock returns an advisory lock held by a locker of its own, with no server: its
// connection is a stand-in that the settle funcs of these tests never touch.
func newTestLock() *AdvisoryLock {
	cfg := advisoryConfig{clock: timingtest.NewManualClock(), watchdog: time.Second}
	cfg.common.resolve()
	a := &AdvisoryLocker{cfg: cfg, held: advisory.NewHeld[*AdvisoryLock](1)}
	a.watchdog = timing.NewLoop(cfg.clock, a.watchdogRound)
	lk := &AdvisoryLock{locker: a, common: &a.cfg.common, key: Int64Key(1), conn: &pgxpool.Conn{}, ending: newGrantEnd()}
	a.held.Grant(lk.key.k, "", lk)
	return lk
}

func lockerOf(lk *AdvisoryLock) *AdvisoryLocker { return lk.locker.(*AdvisoryLocker) }

// Unlock's end: Done closes before the session is settled (the statement may hang), the
// session is settled once, and the lock leaves the locker's held set; a second end (an Unlock
// racing the watchdog, or a second Unlock) neither settles the session again nor changes the
// cause.
func TestAdvisoryLockEndOnUnlock(t *testing.T) {
	lk := newTestLock()
	settled := 0
	ended, ran := lk.end(ErrUnlocked, true, func(*pgxpool.Conn) {
		settled++
		require.True(t, lk.ending.ended(), "Done was open while the unlock statement ran")
	})
	require.True(t, ended)
	require.True(t, ran)
	for _, doneFirst := range []bool{true, false} {
		ended, ran = lk.end(errors.New("lost"), doneFirst, func(*pgxpool.Conn) { settled++ })
		require.False(t, ended)
		require.False(t, ran)
	}
	require.Equal(t, 1, settled)
	require.ErrorIs(t, lk.Err(), ErrUnlocked)
	require.Nil(t, lk.conn)
	require.Zero(t, lockerOf(lk).held.Len(), "the ended lock is still in the locker's held set")
}

// A lost session's end: Done stays open until the session is closed and the locker has
// forgotten the lock, so that a holder woken by Done finds nothing held and may lock the name
// again at once (the review of issue 9 found Done closing first, and a TryLock right after it
// failing with ErrAlreadyHeld).
func TestAdvisoryLockEndOnLossClosesDoneLast(t *testing.T) {
	lk := newTestLock()
	release := make(chan struct{})
	settling := make(chan struct{})
	go lk.end(errors.New("session probe failed"), false, func(*pgxpool.Conn) {
		close(settling)
		<-release
	})
	<-settling
	select {
	case <-lk.Done():
		t.Fatal("Done closed while the lost session was still being closed")
	default:
	}
	close(release)
	<-lk.Done()
	lockerOf(lk).mu.Lock()
	defer lockerOf(lk).mu.Unlock()
	require.Zero(t, lockerOf(lk).held.Len(), "Done closed before the locker forgot the lock")
}

// An Unlock that races a loss (the watchdog took the session and is closing it) returns only
// once the session is closed and the locker has forgotten the lock, so that a TryLock right
// after it is not refused with ErrAlreadyHeld; so does a second Unlock racing the first.
func TestAdvisoryLockEndRacingEnds(t *testing.T) {
	for _, first := range []struct {
		desc      string
		doneFirst bool
	}{{"UnlockRacingLoss", false}, {"UnlockRacingUnlock", true}} {
		t.Run(first.desc, func(t *testing.T) {
			lk := newTestLock()
			release := make(chan struct{})
			settling := make(chan struct{})
			go lk.end(errors.New("first"), first.doneFirst, func(*pgxpool.Conn) {
				close(settling)
				<-release
			})
			<-settling
			returned := make(chan struct{})
			go func() {
				lk.end(ErrUnlocked, true, func(*pgxpool.Conn) { t.Error("the session was settled twice") })
				close(returned)
			}()
			select {
			case <-returned:
				t.Fatal("Unlock returned while the first end was still settling the session")
			case <-time.After(20 * time.Millisecond):
			}
			close(release)
			<-returned
			lockerOf(lk).mu.Lock()
			defer lockerOf(lk).mu.Unlock()
			require.Zero(t, lockerOf(lk).held.Len(), "Unlock returned before the locker forgot the lock")
		})
	}
}

// afterFunc runs each registered func once, after done has closed, and never one that was
// stopped; one registered after the end runs at once.
func TestGrantEndAfterFunc(t *testing.T) {
	g := newGrantEnd()
	ran := make(chan string, 3)
	g.afterFunc(func() {
		select {
		case <-g.done:
			ran <- "first"
		default:
			ran <- "first, before done closed"
		}
	})
	stop := g.afterFunc(func() { ran <- "stopped" })
	require.True(t, stop(), "stopped before the end")
	require.False(t, stop(), "stopped twice")
	require.True(t, g.finish(errors.New("end")))
	require.Equal(t, "first", <-ran)
	late := g.afterFunc(func() { ran <- "late" })
	require.Equal(t, "late", <-ran)
	require.False(t, late(), "a func registered after the end has started")
	require.False(t, g.finish(errors.New("again")))
	select {
	case s := <-ran:
		t.Fatalf("ran again: %s", s)
	default:
	}
}
