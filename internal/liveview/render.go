package liveview

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"slices"
	"strings"
	"time"
)

//go:embed assets
var assets embed.FS

// Pages are the pages of the view, in the order the navigation shows them; "name" (one lease
// name: its queue and timeline) is reached from the others.
var Pages = []struct{ Path, Title string }{
	{"leases", "Leases"},
	{"advisory", "Advisory locks"},
	{"semaphores", "Semaphores"},
	{"elections", "Elections"},
	{"jobs", "Jobs"},
	{"fences", "Fences"},
	{"ratelimits", "Rate limits"},
}

var templates = template.Must(template.New("").Funcs(template.FuncMap{
	"ms":    func(t time.Time) int64 { return t.UnixMilli() },
	"dur":   formatDuration,
	"since": func(now, t time.Time) string { return formatDuration(now.Sub(t)) },
	"until": func(now, t time.Time) string { return formatDuration(t.Sub(now)) },
	"clock": func(t time.Time) string { return t.UTC().Format("15:04:05.000") },
	"str": func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	},
	"dict": func(kv ...any) map[string]any {
		m := make(map[string]any, len(kv)/2)
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	},
	"pids": func(ps []int32) string {
		s := make([]string, len(ps))
		for i, p := range ps {
			s[i] = fmt.Sprint(p)
		}
		return strings.Join(s, ",")
	},
}).ParseFS(assets, "assets/*.html"))

// formatDuration renders d to the tenth of a second below a minute, else to the second.
func formatDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return d.Round(time.Second).String()
}

// Page is what the layout of a page needs.
type Page struct {
	Page, Title, Name string
	Events            string // the URL of the page's event stream, relative
	CSRF              string
	Writes            bool
	Nav               []struct{ Path, Title string }
	Fragment          template.HTML
}

// RenderPage renders a whole page around its fragment.
func RenderPage(p Page) ([]byte, error) {
	p.Nav = Pages
	var b bytes.Buffer
	err := templates.ExecuteTemplate(&b, "page", p)
	return keepCR(b.Bytes()), err
}

// keepCR writes each carriage return of html as a character reference. html/template leaves a
// carriage return as it is, which an HTML parser reads as a line feed (and an event stream as
// the end of a line): as a reference, a name or holder with one reaches the page (its heading,
// title and attributes) exactly, so "a\rb" and "a\nb" stay apart.
func keepCR(html []byte) []byte { return bytes.ReplaceAll(html, []byte("\r"), []byte("&#13;")) }

// fragment is what a page's live part needs: the snapshot, and what is derived from it.
type fragment struct {
	Page, Name string
	S          *Snapshot
	Now        time.Time
	Polls      int64  // the poll this fragment shows
	Err        string // the last poll's error
	Writes     bool
	Window     time.Duration

	Unknown  bool // page "name": the lease list was cut before Name
	Leases   []leaseRow
	Holders  map[string]*leaseRow // the held leases by name
	Queue    []Waiter
	Held     *leaseRow
	Spans    []Span
	Timeline timeline
	Cut      []string
}

type leaseRow struct {
	Lease
	Late    bool
	Waiters []Waiter
}

// Fragment returns the live part of page (name: the lease name of page "name") for view v,
// rendered once per view and page.
func (p *Poller) Fragment(v *View, page, name string, writes bool, window time.Duration) ([]byte, error) {
	key := page + "\x00" + name
	v.mu.Lock()
	defer v.mu.Unlock()
	if b, ok := v.cache[key]; ok {
		return b, nil
	}
	f := fragment{Page: page, Name: name, S: v.Snap, Polls: v.Polls, Writes: writes, Window: window}
	if v.Err != nil {
		f.Err = v.Err.Error()
	}
	tmpl := "live-" + page
	if f.S == nil { // no poll has succeeded yet
		f.S = &Snapshot{Now: time.Now()}
		tmpl = "live-nodata"
	}
	f.Now = f.S.Now
	for k := range f.S.Cut {
		f.Cut = append(f.Cut, k)
	}
	slices.Sort(f.Cut)
	f.Holders = map[string]*leaseRow{}
	queues := map[string][]Waiter{}
	for _, w := range f.S.Waiters {
		queues[w.Name] = append(queues[w.Name], w)
	}
	for _, l := range f.S.Leases {
		if !l.ExpiresAt.After(f.Now) {
			continue
		}
		r := leaseRow{Lease: l, Late: l.Late(f.Now), Waiters: queues[l.Name]}
		f.Leases = append(f.Leases, r)
		f.Holders[l.Name] = &r
		if l.Name == name {
			f.Held = &r
		}
	}
	if page == "name" {
		f.Unknown = f.S.Cut["leases"] // a name the cut list does not show may be held all the same
		f.Queue = queues[name]
		f.Spans = p.Spans(name)
		f.Timeline = drawTimeline(f.Spans, f.Now, window)
	}
	var b bytes.Buffer
	if err := templates.ExecuteTemplate(&b, tmpl, f); err != nil {
		return nil, err
	}
	out := keepCR(b.Bytes())
	v.cache[key] = out
	return out, nil
}

// timeline is a name's spans drawn on an axis 1000 units wide, over the window up to now.
type timeline struct {
	Bars  []bar
	Ticks []tick
}

type bar struct {
	X, W       float64
	Label      string // shown inside the bar when it is wide enough
	Title      string // the tooltip
	Class      string
	Mark       bool
	ShowLabel  bool
	LabelX     float64
	EndX       float64
	EndedClass string
}

type tick struct {
	X     float64
	Label string
}

// drawTimeline draws spans on an axis that ends now and begins a little before the first
// span's start (at least one second before now, at most window before).
func drawTimeline(spans []Span, now time.Time, window time.Duration) timeline {
	span := time.Second
	if len(spans) > 0 {
		span = max(span, now.Sub(spans[0].Start)*21/20)
	}
	span = min(span, window)
	from := now.Add(-span)
	x := func(t time.Time) float64 {
		v := float64(t.Sub(from)) / float64(span) * 1000
		return min(max(v, 0), 1000)
	}
	var tl timeline
	for i, s := range spans {
		end := s.End
		if end.IsZero() {
			end = now
		}
		b := bar{X: x(s.Start), Mark: s.Mark, Class: fmt.Sprintf("g%d", i%4)}
		b.W = max(x(end)-b.X, 1.5)
		b.EndX = b.X + b.W
		b.LabelX = b.X + 4
		if s.Mark {
			b.Class = "forced"
			b.Title = fmt.Sprintf("forced release at %s: fenced with token %d", s.Start.UTC().Format("15:04:05.000"), s.Token)
		} else {
			state := "held"
			if s.Ended != "" {
				state = s.Ended + " at " + s.End.UTC().Format("15:04:05.000")
			}
			b.Label = fmt.Sprintf("%s · %d", s.Holder, s.Token)
			b.Title = fmt.Sprintf("%s, token %d, granted %s, %s", s.Holder, s.Token, s.Start.UTC().Format("15:04:05.000"), state)
			b.ShowLabel = b.W >= 120
			b.EndedClass = strings.ReplaceAll(s.Ended, " ", "-")
		}
		tl.Bars = append(tl.Bars, b)
	}
	step := span / 5
	for i := 0; i <= 5; i++ {
		t := from.Add(time.Duration(i) * step)
		tl.Ticks = append(tl.Ticks, tick{X: x(t), Label: "-" + formatDuration(now.Sub(t))})
	}
	tl.Ticks[5].Label = "now"
	return tl
}
