package liveview

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/forcedrelease"
	"github.com/fencelock/fencelock/internal/validate"
)

// CSRFHeader is the header a forced release must carry with the page's CSRF token.
const CSRFHeader = "X-Fencelock-CSRF"

// releaseLockTimeout bounds how long a forced release waits for the lease row, which a
// holder's guarded transaction or a RunLocked holds until it ends.
const releaseLockTimeout = 5 * time.Second

// releaseReply is the JSON answer to a forced release.
type releaseReply struct {
	OK       bool   `json:"ok"`
	Message  string `json:"message"`
	NewToken int64  `json:"new_token,omitempty"`
}

// release serves POST release: a forced release of the grant (name, holder, token) that the
// page showed and the operator confirmed, with the CLI's semantics (fencelock release --force
// NAME --token T --fence ...). The checks come in this order, and a request that fails one
// changes nothing: writes allowed, same origin (the CSRF token and Fetch metadata), an
// authenticated request, the arguments, then the grant: its token must be the lease's last
// grant's, and its holder the one the page showed.
func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	reply := func(code int, rep releaseReply) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(rep)
	}
	refuse := func(code int, format string, a ...any) {
		reply(code, releaseReply{Message: fmt.Sprintf(format, a...)})
	}
	if s.cfg.Writer == nil {
		refuse(http.StatusForbidden, "forced release is off: this view is read-only (built without ui.WithForcedRelease)")
		return
	}
	if err := s.cop.Check(r); err != nil {
		refuse(http.StatusForbidden, "refused: a cross-origin request (%v)", err)
		return
	}
	if subtle.ConstantTimeCompare([]byte(r.Header.Get(CSRFHeader)), []byte(s.csrf)) != 1 {
		refuse(http.StatusForbidden, "refused: the request does not carry this page's CSRF token (reload the page)")
		return
	}
	who, err := s.cfg.Authorize(r)
	if err != nil {
		refuse(http.StatusUnauthorized, "not authenticated: %v", err)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		refuse(http.StatusBadRequest, "bad request: %v", err)
		return
	}
	name, holder := r.PostForm.Get("name"), r.PostForm.Get("holder")
	token, err := strconv.ParseInt(r.PostForm.Get("token"), 10, 64)
	if err == nil && token <= 0 {
		err = errors.New("must be > 0")
	}
	if err != nil {
		refuse(http.StatusBadRequest, "bad request: token %q: %v", r.PostForm.Get("token"), err)
		return
	}
	if err := validate.Name("name", name); err != nil {
		refuse(http.StatusBadRequest, "bad request: %v", err)
		return
	}
	if err := validate.Name("holder", holder); err != nil {
		refuse(http.StatusBadRequest, "bad request: %v", err)
		return
	}
	fences := []string{name}
	for _, f := range r.PostForm["fence"] {
		if err := validate.Name("fence", f); err != nil {
			refuse(http.StatusBadRequest, "bad request: %v", err)
			return
		}
		if !slices.Contains(fences, f) {
			fences = append(fences, f)
		}
	}
	res, code, err := s.forceRelease(r.Context(), name, holder, token, fences)
	if err != nil {
		refuse(code, "%v", err)
		return
	}
	s.poller.Forced(name, token, res.newToken, res.handedTo, time.Now())
	s.cfg.Logger.InfoContext(r.Context(), "fencelock live view: forced release",
		slog.String("by", who), slog.String("lease", name), slog.String("holder", holder),
		slog.Int64("token", token), slog.Int64("new_token", res.newToken), slog.Any("fenced", fences))
	msg := fmt.Sprintf("released lease %q held by %s (token %d); fenced with token %d (%s)", name, holder, token, res.newToken, strings.Join(fences, ", "))
	switch {
	case res.lapsed:
		msg = fmt.Sprintf("lease %q: the grant of %s (token %d) had lapsed; fenced with token %d (%s)", name, holder, token, res.newToken, strings.Join(fences, ", "))
	case res.handedTo != "":
		msg += "; handed to " + res.handedTo
	case res.woken != "":
		msg += "; freed, and the head of the queue, " + res.woken + ", woken to take it"
	}
	reply(http.StatusOK, releaseReply{OK: true, Message: msg, NewToken: res.newToken})
}

type forced struct {
	newToken int64
	handedTo string // the waiter the lease (or the semaphore's permit) went to
	woken    string // a permit freed, not given: the head of the semaphore's queue, told to take it
	lapsed   bool
}

// forceRelease runs fencelock.force_release for the grant with token in a transaction with
// a lock timeout, and commits only if that grant was the lease's last and holder's. It returns
// the HTTP status of a refusal with its error.
func (s *Server) forceRelease(ctx context.Context, name, holder string, token int64, fences []string) (forced, int, error) {
	var out forced
	tx, err := s.cfg.Writer.Begin(ctx)
	if err != nil {
		return out, http.StatusServiceUnavailable, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit, a no-op
	if err := forcedrelease.SetLockTimeout(ctx, tx, releaseLockTimeout); err != nil {
		return out, http.StatusServiceUnavailable, err
	}
	// The grant the page showed, checked on the locked row before anything is changed.
	var curHolder string
	var curToken int64
	err = tx.QueryRow(ctx, `SELECT holder, token FROM fencelock.leases WHERE name = $1 FOR UPDATE`, name).Scan(&curHolder, &curToken)
	if r, code, err := lockError(name, err); err != nil {
		return r, code, err
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return out, http.StatusConflict, fmt.Errorf("lease %q: never granted, so not the grant with token %d; nothing changed", name, token)
	case err != nil:
		return out, http.StatusServiceUnavailable, fmt.Errorf("force release lease %q: %w", name, err)
	case curToken != token || curHolder == forceReleaseHolder:
		return out, http.StatusConflict, fmt.Errorf("lease %q: its last grant is %s's with token %d, not %d; nothing changed", name, curHolder, curToken, token)
	case curHolder != holder:
		return out, http.StatusConflict, fmt.Errorf("lease %q: the grant with token %d is %s's, not %s's; nothing changed", name, token, curHolder, holder)
	}
	fr, err := forcedrelease.Run(ctx, tx, name, fences, &token)
	if r, code, err := lockError(name, err); err != nil {
		return r, code, err
	}
	if err != nil {
		return out, http.StatusServiceUnavailable, fmt.Errorf("force release lease %q: %w", name, err)
	}
	// The row was locked and checked above, so force_release ends exactly that grant.
	if fr.OldToken == nil || *fr.OldToken != token || fr.NewToken == nil {
		return out, http.StatusConflict, fmt.Errorf("lease %q: the grant with token %d is no longer its last; nothing changed", name, token)
	}
	if err := tx.Commit(ctx); err != nil {
		return out, http.StatusServiceUnavailable, fmt.Errorf("force release lease %q: commit: %w", name, err)
	}
	out.newToken, out.lapsed = *fr.NewToken, fr.Lapsed
	if fr.HandedTo != nil {
		out.handedTo = *fr.HandedTo
	}
	if fr.Woken != nil {
		out.woken = *fr.Woken
	}
	return out, http.StatusOK, nil
}

// lockError maps the lock errors of a forced release's statements (lock timeout, deadlock) to
// a refusal (409); nil for any other error.
func lockError(name string, err error) (forced, int, error) {
	switch {
	case forcedrelease.LockTimeout(err):
		return forced{}, http.StatusConflict, fmt.Errorf("lease %q: its row is locked by a transaction (a RunLocked, a guarded transaction of its holder, or a grant in flight); gave up after %v; nothing changed: retry once it ends", name, releaseLockTimeout)
	case forcedrelease.Deadlock(err):
		return forced{}, http.StatusConflict, fmt.Errorf("lease %q: a transaction of its holder locked a fence row and then the lease row while this release waited for them (PostgreSQL ended the release to break the deadlock); nothing changed: retry", name)
	}
	return forced{}, 0, nil
}
