package conformance_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/go-locker/locker"
)

// changeMutants break one sentence of driver.ChangeWatcher each; the trace
// table's CW rows name them.
var changeMutants = []mutant{
	{"changes-registers-late", "Driver/ChangeWatcher", blocking},
	{"changes-misses-grant", "Driver/ChangeWatcher", blocking},
	{"changes-misses-release", "Driver/ChangeWatcher", blocking},
	{"changes-misses-takeover", "Driver/ChangeWatcher", blocking},
	{"changes-stop-noop", "Driver/ChangeWatcher", blocking},
	{"changes-stop-waits", "Driver/ChangeWatcher", blocking},
	{"changes-empty-key-accepted", "Driver/ChangeWatcher", blocking},
	{"changes-ignores-ctx", "Driver/ChangeWatcher", blocking},
	{"closed-optional-calls-work", "Driver/ChangeWatcher", blocking},
	{"changes-refused-plain-error", "Driver/ChangeWatcher", blocking},
	{"changes-deaf-after-reset", "Faults/ChangesAcrossReset", blocking},
}

func init() { mutants = append(mutants, changeMutants...) }

// flawCW is one WatchChanges watch of the flawed driver: notifications
// mark it dirty, and its own goroutine calls changed, one call at a time,
// until stop.
type flawCW struct {
	by    *flawed
	dirty chan struct{}
	done  chan struct{}
	mu    sync.Mutex // held while changed runs (changes-stop-waits)
}

func (w *flawCW) mark() {
	select {
	case w.dirty <- struct{}{}:
	default:
	}
}

func (w *flawCW) loop(changed func()) {
	for {
		select {
		case <-w.done:
			return
		case <-w.dirty:
		}
		w.mu.Lock()
		changed()
		w.mu.Unlock()
	}
}

// notifyChanges tells the watches of key that its holder may have
// changed; why is "grant", "takeover" or "release". s.mu is held.
func (s *flawStore) notifyChanges(key, why string) {
	if s.is("changes-misses-"+why) || (why == "takeover" && s.is("changes-misses-grant")) {
		return
	}
	for w := range s.cws[key] {
		w.mark()
	}
}

// notifyGrant is notifyChanges for a new grant of key, old the record it
// replaces (an expired one: a takeover), if any. s.mu is held.
func (s *flawStore) notifyGrant(key string, old *flawRec) {
	if old != nil {
		s.notifyChanges(key, "takeover")
		return
	}
	s.notifyChanges(key, "grant")
}

// resetChanges is the watches' part of a Reset of f: they report once, as
// after a reconnect (changes-deaf-after-reset: they are dropped unheard).
func (f *flawed) resetChanges() {
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ws := range s.cws {
		for w := range ws {
			if w.by != f {
				continue
			}
			if f.is("changes-deaf-after-reset") {
				delete(ws, w)
			} else {
				w.mark()
			}
		}
	}
}

func (f *flawed) WatchChanges(ctx context.Context, key string, changed func()) (func(), error) {
	if f.is("changes-ignores-ctx") {
		ctx = context.Background()
	}
	checked := key
	if key == "" && f.is("changes-empty-key-accepted") {
		checked = "-"
	}
	if err := f.checkOptional(ctx, checked); err != nil {
		return nil, f.out(err)
	}
	if f.is("changes-refused-plain-error") && !strings.HasPrefix(key, locker.ElectionPrefix) {
		return nil, errors.New("flawed: only election keys are announced")
	}
	key = f.norm(key)
	w := &flawCW{by: f, dirty: make(chan struct{}, 1), done: make(chan struct{})}
	go w.loop(changed)
	s := f.st
	register := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.cws == nil {
			s.cws = map[string]map[*flawCW]struct{}{}
		}
		if s.cws[key] == nil {
			s.cws[key] = map[*flawCW]struct{}{}
		}
		s.cws[key][w] = struct{}{}
	}
	if f.is("changes-registers-late") {
		time.AfterFunc(200*time.Millisecond, register)
	} else {
		register()
	}
	var once sync.Once
	return func() {
		if f.is("changes-stop-noop") {
			return
		}
		if f.is("changes-stop-waits") {
			w.mu.Lock()
			defer w.mu.Unlock()
		}
		once.Do(func() {
			close(w.done)
			s.mu.Lock()
			delete(s.cws[key], w)
			s.mu.Unlock()
		})
	}, nil
}
