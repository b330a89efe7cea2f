package models

import "github.com/mokopt/mokopt/graph"

// Write builds cfg's model and saves it to path. With cfg.External the
// weights are streamed into the side file path+".data" (tensors under 1 KiB
// stay inline); otherwise everything is inside path, which protobuf limits
// to 2 GiB.
func Write(cfg Config, path string) error {
	m, err := Build(cfg)
	if err != nil {
		return err
	}
	return m.Save(path, graph.SaveOptions{External: graph.ExternalKeep})
}
