//go:build ort

package main

import "github.com/mokopt/mokopt/internal/ortrun"

func init() {
	engines["ort"] = ortrun.RunModel
	engineInit["ort"] = ortrun.Init
}
