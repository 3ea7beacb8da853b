package fencelock

import (
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/internal/advisory"
)

// The watchdog: while an AdvisoryLocker holds session locks, its loop (timing.Loop) runs a round
// every interval (AdvisoryLocker.watchdogRound) that probes each held lock's session, all
// probes at once, each bounded by the interval, and ends the locks whose session failed. The
// loop is armed with the first lock held, and stops at its first round that finds none held
// (the last unlock leaves it armed: locks taken and released back to back then arm the timer
// once an interval, not twice a lock); between rounds no goroutine runs, so a lock held for
// less than one interval costs none.
//
// A lock's first probe also labels its session (application_name "fencelock <name>", which
// fencelock.advisory_locks shows): labelling lazily keeps the set_config and its
// ParameterStatus message off the lock and unlock pair (issue 31), so a lock released within
// one interval is never labelled, and is shown by its key only.

// probe checks the lock's session, for at most interval; a failure ends the lock. Until a
// probe has succeeded it labels the session too (advisory.LabelSession), and records that
// in labelled, for Unlock to put the previous application_name back. A probe that finds the
// connection busy (Unlock running) skips this round.
func (lk *AdvisoryLock) probe(interval time.Duration) {
	if !lk.connMu.TryLock() {
		return
	}
	conn := lk.conn
	if conn == nil {
		lk.connMu.Unlock()
		return
	}
	var err error
	if lk.labelled {
		err = advisory.CheckSession(conn, lk.pid, interval)
	} else if err = advisory.LabelSession(conn, lk.pid, lk.name, lk.key.k, interval); err == nil {
		lk.labelled = true
	}
	lk.connMu.Unlock()
	var changed *advisory.PIDChangedError
	switch {
	case errors.As(err, &changed):
		lk.lost(fmt.Errorf("%w (pid %d, was %d): %w", errPIDChanged, changed.Got, changed.Want, ErrConnectionPooler))
	case err != nil:
		lk.lost(fmt.Errorf("session probe: %w", err))
	}
}

// errPIDChanged is the cause of a lock lost because its connection reaches another backend.
var errPIDChanged = errors.New("the connection now reaches another backend")
