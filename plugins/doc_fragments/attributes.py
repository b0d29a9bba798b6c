# -*- coding: utf-8 -*-
# Copyright (c) warmstart developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations


class ModuleDocFragment:
    """The ``attributes`` the collection's modules share.

    ansible-core merges attributes key by key, and what is merged first wins: a module's own fields
    win over every fragment, and an earlier fragment in ``extends_documentation_fragment`` over a later
    one. So a module lists the specific sections (NODE, API, INFO, NO_DIFF, PROGRESS)
    first and this generic DOCUMENTATION last, and keeps in its own ``attributes`` only what is its own
    (usually the check mode description and the platform's).
    """

    # Generic descriptions, for an attribute that neither the module nor a section describes.
    DOCUMENTATION = r"""
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
  platform:
    description: Target OS/families that can be operated against.
"""

    # A module that changes something but produces no diff.
    NO_DIFF = r"""
attributes:
  diff_mode:
    support: none
    description: No diff is produced.
"""

    # A module that only reads.
    INFO = r"""
attributes:
  check_mode:
    support: full
    description: Reads only; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
"""

    # A module that runs on the node it works on (CRIU, processes, the node's files).
    NODE = r"""
attributes:
  platform:
    support: full
    platforms: linux
"""

    # A module that talks to the Kubernetes API server.
    API = r"""
attributes:
  platform:
    support: full
    platforms: posix
    description: Any node with network access to the API server, usually the controller.
"""

    # A long-running module with an action plugin that prints its progress.
    PROGRESS = r"""
attributes:
  action:
    support: full
    description: An action plugin runs the module and prints its progress while it works (O(progress_interval)).
  async:
    support: full
    description: Runs under C(async) like any module, then without progress lines.
"""
