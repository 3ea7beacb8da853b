package fencelock

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/notify"
)

// How the root package reaches its pools' notifiers (internal/notify: one listening connection
// per pool, shared by the pool's lessors, semaphores and election observers), so that a release that
// hands a lease to a wait of one of the pool's lessors (LeaseRelease) wakes that wait at once,
// without a poll in between. Only the head of a queue is notified: no herd of waiters.
//
// A lessor attaches to its pool's notifier at its first refused wait (a lessor that never
// waits never opens one) and stays attached while it has a wait or a held lease, and for a
// second (listenerLinger) after it has neither, so that a lessor that holds, releases and waits
// again finds LISTEN in place at its first attempt; the notifier closes a second after its last
// subscriber has left. While attached, each wait of the lessor subscribes to the wake-ups of
// its wait id. Where LISTEN cannot work (behind a pooler, or while the connection is down),
// waits poll; every wait is woken when LISTEN comes up or goes down, to poll or to tell the
// queue its channel.

// listenBackoff paces attempts to open the listening connection again.
var listenBackoff = ExponentialBackoff(10*time.Millisecond, time.Second)

// subscribe subscribes h to topic under key on pool's notifier (opened, if it must be, with
// logger's warnings and listenBackoff).
func subscribe(pool *pgxpool.Pool, logger *slog.Logger, topic notify.Topic, key string, h notify.Handler) *notify.Subscription {
	return notify.Subscribe(pool, topic, key, h, notify.Options{Logger: logger, Backoff: listenBackoff})
}
