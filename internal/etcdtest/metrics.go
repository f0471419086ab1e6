package etcdtest

import (
	"context"
	"fmt"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics reads the Prometheus metrics every given endpoint ("host:port",
// an etcd client address) serves at /metrics, and returns their families,
// each endpoint's in turn (a family repeats once per endpoint). It fails on
// the first endpoint that cannot be read or parsed.
func Metrics(ctx context.Context, endpoints ...string) ([]*dto.MetricFamily, error) {
	var out []*dto.MetricFamily
	for _, ep := range endpoints {
		mfs, err := metricsOf(ctx, ep)
		if err != nil {
			return nil, fmt.Errorf("etcdtest: metrics of %s: %w", ep, err)
		}
		out = append(out, mfs...)
	}
	return out, nil
}

// Metrics is the package-level Metrics of the cluster's running members.
func (c *Cluster) Metrics(ctx context.Context) ([]*dto.MetricFamily, error) {
	var eps []string
	for _, m := range c.Members {
		if m.Running() {
			eps = append(eps, m.Endpoint())
		}
	}
	return Metrics(ctx, eps...)
}

func metricsOf(ctx context.Context, ep string) ([]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ep+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := make([]*dto.MetricFamily, 0, len(fams))
	for _, f := range fams {
		out = append(out, f)
	}
	return out, nil
}
