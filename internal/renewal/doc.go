// Package renewal is the scheduling of a lessor's held leases: the heartbeat, which renews
// them in batches, and the trust watch, which ends each at the end of its trust window.
//
// # The heartbeat
//
// A [timing.Loop], armed exactly while the owner holds leases (or a renewal batch is in
// flight), its rounds run on a timer, none between rounds. It keeps the held leases with a
// heartbeat in a min-heap by renewal time and, when leases come due, hands them to the owner's
// renewal statement in batches of at most 1,000, at most two statements at a time, each in a
// goroutine of its own, so a round is never blocked by a statement. Adding or removing a
// lease costs O(log n) and moves the loop's next round only when it changes the earliest
// renewal; a round takes the k leases it renews at O(k log n), never a scan of all held
// leases. When a lease is due, and what is done with one that is late or about to lapse, is
// the schedule's ([timing.Times.Verdict]).
//
// # The renewal window
//
// Leases granted one by one come due one by one: renewed as they came due, a lessor that took
// 10,000 leases over a few seconds sent thousands of statements a heartbeat, a few leases
// each, and spent most of its renewal CPU on the statements' fixed cost. So a lease that comes
// due opens a window of a quarter of its heartbeat, and every lease whose renewal falls due
// inside it is renewed at once, early, in the same statements:
//
//	queue time:   a ──── b ── c ─────── d ─────────────── e
//	              │◀── window (heartbeat/4) ──▶│
//	round at a:   renews a, b, c, d (b, c, d early)     e opens the next window
//
// Renewed by one statement, those leases share its send time, so they come due together
// again: after a heartbeat or two the held leases fall into cohorts at least a window apart,
// at most three per renewal period, and a round renews hundreds to thousands at once. Renewing
// early costs nothing in safety: a trust window only grows, counted from the send time of the
// statement that renewed it; no lease is renewed later than without the window. A lease is
// never renewed more than a quarter of its own heartbeat early (a short heartbeat among long
// ones stays on its own schedule), and one whose last renewal failed waits for its retry time.
//
// # The trust watch
//
// A second min-heap of the same leases, by the end of their trust window, and one timer set
// for the earliest. When it fires (on a goroutine of the runtime's, whatever the heartbeat, a
// renewal statement or the pool is doing), it ends every lease whose window is over, and moves
// on every lease that a renewal has extended since it was queued: a renewal only grows the
// window, so a lease's place in the heap is never later than its window's end, and the heap is
// corrected lazily, once a window, not at every renewal. One timer rather than one per lease:
// 100,000 runtime timers re-armed every heartbeat made the runtime rescan its timer heap
// (docs/PERFORMANCE.md).
//
//	owner (Lessor)          Renewer[T]                       owner's hooks
//	add   ──AddLocked──▶    heap by renewal time ──round──▶  Renew(ctx, batch)  (one statement)
//	end   ──ForgetLocked──▶ heap by trust window ──timer──▶  Expire(lease)      (Done closes)
//
// # Narrow interface
//
// The package never sees a lease or a database: a [Renewer] works over any item type T
// through the hooks of its [Hooks] (the item's schedule, whether it ended, whether the owner
// still holds it, the renewal statement, the end of a trust window), and keeps its state in a
// [Slot] that the owner embeds in each item. It shares the owner's mutex, under which the
// owner adds and removes items from its held set, so a lease is never queued after it left
// that set. It runs no SQL itself; the statement is the owner's (fencelock's LeaseRenew).
//
// The scheme is the lease of Gray and Cheriton (1989) renewed by a heartbeat, with the
// holder's trust window of Kleppmann (2016); batching renewals into one statement is the
// keep-alive of etcd's lease client (one stream for every lease of a client).
package renewal
