# Copyright Jonathan Hartley 2013. BSD 3-Clause license, see LICENSE file.
