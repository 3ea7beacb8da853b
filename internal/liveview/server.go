package liveview

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/db"
)

// keepAlive is how often an idle event stream sends a comment, so that proxies keep it open.
const keepAlive = 15 * time.Second

// Config is a Server's settings; package ui validates them.
type Config struct {
	Interval time.Duration // between polls
	Window   time.Duration // the timeline's span
	MaxRows  int           // rows per list at the most
	Always   bool          // poll with no page open too
	Logger   *slog.Logger

	// Writer runs forced releases; nil: read-only. Authorize, required with Writer, says who
	// sent a request, or why it is not authenticated.
	Writer    *pgxpool.Pool
	Authorize func(*http.Request) (string, error)
}

// Server serves the pages, their event streams and forced releases. Safe for concurrent use.
type Server struct {
	cfg    Config
	poller *Poller
	mux    *http.ServeMux
	csrf   string
	cop    *http.CrossOriginProtection
	done   <-chan struct{} // closed when the server closes: event streams end
}

// NewServer returns a server of reader's snapshots. Run its poller with Poller().Run; done
// closing ends every event stream.
func NewServer(reader db.DBTX, cfg Config, done <-chan struct{}) *Server {
	var secret [16]byte
	_, _ = rand.Read(secret[:])
	s := &Server{
		cfg:    cfg,
		poller: NewPoller(reader, cfg.Interval, cfg.Window, cfg.MaxRows, cfg.Always, cfg.Logger),
		mux:    http.NewServeMux(),
		csrf:   hex.EncodeToString(secret[:]),
		cop:    http.NewCrossOriginProtection(),
		done:   done,
	}
	static, _ := fs.Sub(assets, "assets")
	s.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { s.page(w, r, "leases") })
	for _, p := range Pages {
		s.mux.HandleFunc("GET /"+p.Path, func(w http.ResponseWriter, r *http.Request) { s.page(w, r, p.Path) })
	}
	s.mux.HandleFunc("GET /name", func(w http.ResponseWriter, r *http.Request) { s.page(w, r, "name") })
	s.mux.HandleFunc("GET /events", s.events)
	s.mux.HandleFunc("POST /release", s.release)
	s.mux.Handle("GET /app.js", http.FileServerFS(static))
	s.mux.Handle("GET /style.css", http.FileServerFS(static))
	return s
}

// Poller returns the server's poller.
func (s *Server) Poller() *Poller { return s.poller }

// ServeHTTP serves the view, with headers that keep the page from being framed or loading
// anything from elsewhere.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	s.mux.ServeHTTP(w, r)
}

func (s *Server) title(page, name string) string {
	if page == "name" {
		return "Lease " + name
	}
	for _, p := range Pages {
		if p.Path == page {
			return p.Title
		}
	}
	return page
}

// page serves a whole page, its live part rendered from a fresh view.
func (s *Server) page(w http.ResponseWriter, r *http.Request, page string) {
	name := r.URL.Query().Get("n")
	if page == "name" && name == "" {
		http.Error(w, "which lease? name?n=NAME", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), pollTimeout)
	defer cancel()
	v := s.poller.Fresh(ctx)
	frag, err := s.poller.Fragment(v, page, name, s.cfg.Writer != nil, s.cfg.Window)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	q := url.Values{"page": {page}}
	if name != "" {
		q.Set("n", name)
	}
	body, err := RenderPage(Page{
		Page: page, Title: s.title(page, name), Name: name,
		Events: "events?" + q.Encode(), CSRF: s.csrf, Writes: s.cfg.Writer != nil,
		Fragment: template.HTML(frag), //nolint:gosec // rendered by html/template
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(body)
}

// maxStreamPages bounds the pages of one event stream: each costs a fragment per poll.
const maxStreamPages = 64

// streamPage is one page of an event stream, and the name of its events.
type streamPage struct{ page, name, event string }

// streamPages returns the pages a request for an event stream asks for: each "page" value in
// order, a "name" page taking the next "n" value; false if one is unknown, a name page has no
// name, one is asked twice, or there are more than maxStreamPages. One page's events are
// named "update"; with several, page i's are "update i".
func streamPages(q url.Values) ([]streamPage, bool) {
	pages, names := q["page"], q["n"]
	if len(pages) == 0 || len(pages) > maxStreamPages {
		return nil, false
	}
	out := make([]streamPage, 0, len(pages))
	seen := make(map[streamPage]bool, len(pages))
	for i, page := range pages {
		sp := streamPage{page: page, event: "update"}
		if len(pages) > 1 {
			sp.event = "update " + strconv.Itoa(i)
		}
		if page == "name" {
			if len(names) == 0 || names[0] == "" {
				return nil, false
			}
			sp.name, names = names[0], names[1:]
		}
		k := streamPage{page: sp.page, name: sp.name}
		if !knownPage(page) || seen[k] {
			return nil, false
		}
		seen[k] = true
		out = append(out, sp)
	}
	return out, true
}

// events streams the live part of each page asked for (see streamPages) as server-sent
// events, one event per page per poll, until the client leaves or the server closes. The
// tabs of a browser share one stream of the pages they show (app.js): over HTTP/1.1 a
// browser opens at most six connections per host, and a stream holds one for good.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	pages, ok := streamPages(r.URL.Query())
	if !ok {
		http.Error(w, "unknown page", http.StatusBadRequest)
		return
	}
	rc := http.NewResponseController(w)
	// An admin server's WriteTimeout would cut the stream every so often: this response has
	// no write deadline (where the server lets a handler say so).
	_ = rc.SetWriteDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	defer s.poller.Subscribe()()
	alive := time.NewTicker(keepAlive)
	defer alive.Stop()
	var sent *View
	for {
		v, changed := s.poller.Current()
		if v != sent && v.Polls > 0 {
			for _, p := range pages {
				frag, err := s.poller.Fragment(v, p.page, p.name, s.cfg.Writer != nil, s.cfg.Window)
				if err != nil {
					return
				}
				if err := writeEvent(w, p.event, frag); err != nil {
					return
				}
			}
			if rc.Flush() != nil {
				return
			}
			sent = v
		}
		select {
		case <-changed:
		case <-alive.C:
			if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil || rc.Flush() != nil {
				return
			}
		case <-r.Context().Done():
			return
		case <-s.done:
			return
		}
	}
}

// writeEvent writes one server-sent event: each line of data in a "data:" field.
func writeEvent(w http.ResponseWriter, event string, data []byte) error {
	var b bytes.Buffer
	b.WriteString("event: " + event + "\n")
	for _, line := range bytes.Split(data, []byte("\n")) { // data has no carriage return (Fragment)
		b.WriteString("data: ")
		b.Write(line)
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	_, err := w.Write(b.Bytes())
	return err
}

func knownPage(page string) bool {
	if page == "name" {
		return true
	}
	for _, p := range Pages {
		if p.Path == page {
			return true
		}
	}
	return false
}
