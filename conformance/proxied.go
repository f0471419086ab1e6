package conformance

import (
	"context"
	"fmt"
	"sync"

	"github.com/go-locker/locker/conformance/faultproxy"
	"github.com/go-locker/locker/driver"
)

// Proxied builds a Harness's Open, Cut and Reset for a TCP backend: every
// Locker it opens reaches each server address through a fault proxy of its
// own (package faultproxy), so that one Locker can be cut off or have its
// connections reset while the others are not. Its zero value is not
// usable; make one with NewProxied.
type Proxied struct {
	targets []string
	open    func(ctx context.Context, addrs []string) (driver.Locker, error)

	mu      sync.Mutex
	proxies map[driver.Locker][]*faultproxy.Proxy
	all     []*faultproxy.Proxy
}

// NewProxied returns a Proxied for the servers at targets ("host:port");
// open opens a Locker on the given addresses, in the order of targets
// (the Locker's proxies). Close closes every proxy.
func NewProxied(targets []string, open func(ctx context.Context, addrs []string) (driver.Locker, error)) *Proxied {
	return &Proxied{targets: targets, open: open, proxies: map[driver.Locker][]*faultproxy.Proxy{}}
}

// Open is a Harness.Open: a Locker behind fresh proxies.
func (p *Proxied) Open(ctx context.Context) (driver.Locker, error) {
	var ps []*faultproxy.Proxy
	closeAll := func() {
		for _, x := range ps {
			_ = x.Close()
		}
	}
	addrs := make([]string, 0, len(p.targets))
	for _, target := range p.targets {
		x, err := faultproxy.New(target)
		if err != nil {
			closeAll()
			return nil, err
		}
		ps = append(ps, x)
		addrs = append(addrs, x.Addr())
	}
	d, err := p.open(ctx, addrs)
	if err != nil {
		closeAll()
		return nil, err
	}
	p.mu.Lock()
	p.proxies[d] = ps
	p.all = append(p.all, ps...)
	p.mu.Unlock()
	return d, nil
}

func (p *Proxied) of(d driver.Locker) ([]*faultproxy.Proxy, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ps := p.proxies[d]; ps != nil {
		return ps, nil
	}
	return nil, fmt.Errorf("conformance: %T was not opened by this Proxied", d)
}

// Cut is a Harness.Cut: it blackholes every proxy of d until heal.
func (p *Proxied) Cut(d driver.Locker) (heal func(), err error) {
	ps, err := p.of(d)
	if err != nil {
		return nil, err
	}
	for _, x := range ps {
		x.Blackhole()
	}
	return func() {
		for _, x := range ps {
			x.Heal()
		}
	}, nil
}

// Reset is a Harness.Reset: it resets every connection through d's proxies.
func (p *Proxied) Reset(d driver.Locker) error {
	ps, err := p.of(d)
	if err != nil {
		return err
	}
	for _, x := range ps {
		x.Reset()
	}
	return nil
}

// Close closes every proxy opened so far.
func (p *Proxied) Close() error {
	p.mu.Lock()
	all := p.all
	p.all = nil
	p.mu.Unlock()
	for _, x := range all {
		_ = x.Close()
	}
	return nil
}
