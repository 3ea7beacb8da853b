package advisory

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fencelock/fencelock/internal/db"
)

// ProbeAll runs one watchdog round: probe for each of locks, all at once, returning when every
// call has returned. Each probe bounds itself ([CheckSession]'s timeout).
func ProbeAll[L any](locks []L, probe func(L)) {
	var wg sync.WaitGroup
	for _, lk := range locks {
		wg.Go(func() { probe(lk) })
	}
	wg.Wait()
}

// PIDChangedError reports that a lock's connection now reaches another backend than the one
// that took the lock: a pooler sits between the client and the server.
type PIDChangedError struct {
	Got, Want uint32
}

// Error describes the PIDChangedError.
func (e *PIDChangedError) Error() string {
	return fmt.Sprintf("the connection now reaches another backend (pid %d, was %d)", e.Got, e.Want)
}

// CheckSession probes the session on conn (AdvisorySessionCheck), for at most timeout: it
// returns nil when the session is alive and its backend pid is pid, a [*PIDChangedError] when
// it is another, else pgx's error as is (the session is gone, or the probe took too long).
// The caller serialises use of conn.
func CheckSession(conn db.DBTX, pid uint32, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	got, err := queries.AdvisorySessionCheck(ctx, conn)
	cancel()
	switch {
	case err != nil:
		return err
	case uint32(got) != pid:
		return &PIDChangedError{Got: uint32(got), Want: pid}
	}
	return nil
}

// LabelSession is [CheckSession] for a lock's first probe (AdvisorySessionLabel): the same
// results, for at most timeout, and when the backend pid is pid it also sets the session's
// application_name to the lock's label, "fencelock <name>" or "fencelock key <key>" (cut to
// 63 bytes: applicationName), so that fencelock.advisory_locks shows the lock by name. It
// labels nothing when it returns a [*PIDChangedError] (another backend is not the lock's).
// Once it has returned nil the lock is labelled, and its unlock puts the previous
// application_name back ([UnlockSession] with labelled). On a pgx error the label may or may
// not have been set: the caller ends the lock and closes the session. The caller serialises
// use of conn.
func LabelSession(conn db.DBTX, pid uint32, name string, key Key, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	got, err := queries.AdvisorySessionLabel(ctx, conn, db.AdvisorySessionLabelParams{
		Pid:   int32(pid),
		Label: applicationName(name, key),
	})
	cancel()
	switch {
	case err != nil:
		return err
	case uint32(got) != pid:
		return &PIDChangedError{Got: uint32(got), Want: pid}
	}
	return nil
}
