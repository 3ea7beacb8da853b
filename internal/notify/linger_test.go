package notify

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A notifier's idle timer that has fired already, its retire waiting for the
// registry's lock, is not disarmed by a subscription that comes meanwhile (subscribe's
// n.idle.Stop() is too late, and sets n.idle to nil); when that subscription closes again
// before the stale retire has run, the stale retire finds no subscription and retires the
// notifier at once, though the new timer gives it a full linger. The notifier then closes its
// connection early, and the next subscriber opens a new one (no wake-up is lost: nobody
// subscribes to a retired notifier). The linger is changed to an hour before the second
// Close, so any retire within 300 ms is the stale one (queued on the registry's lock already,
// it runs at once).
//
// Found by issue 22's review; it failed when the stale retire won the race (most rounds) until
// retire checked that it is the current timer's (idleGen).
func TestStaleIdleTimerKeepsLinger(t *testing.T) {
	for round := range 20 {
		reg, started := testRegistry(5 * time.Millisecond)
		pool := &pgxpool.Pool{}
		s1 := reg.subscribe(pool, Wakeups, "", Handler{}, Options{})
		ctx := <-started
		reg.mu.Lock()
		s1.Close()                        // arms the idle timer (5 ms)
		time.Sleep(30 * time.Millisecond) // it fires; its retire waits for reg.mu
		reg.linger = time.Hour            // the next idle timer gives a full hour
		reg.mu.Unlock()
		s2 := reg.subscribe(pool, Wakeups, "", Handler{}, Options{})
		if s2.n != s1.n {
			continue // the stale retire ran first: a normal retire, a new notifier
		}
		s2.Close() // arms a timer of an hour
		select {
		case <-ctx.Done():
			t.Fatalf("round %d: the notifier retired at once after its last subscription closed, not an hour later", round)
		case <-time.After(300 * time.Millisecond): // a stale retire is queued already: it runs at once
		}
	}
}
