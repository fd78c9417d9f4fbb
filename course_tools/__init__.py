"""course_tools: the course's machinery around the library; learners read ``course_utils``, not this.

Subpackages, one per job:

- ``cli``: the ``course`` command and the subcommands that run models and notebooks (doctor, run, train,
  sample, chat) with the run-time tuning and the processes of training;
- ``exercises``: the checks a notebook calls, each lesson's references, predictions, ``course assign``;
- ``grading``: ``course grade``, the sandbox, the typed job contract between grader and worker, reports;
- ``editions``: ``course translate`` (with the catalogue of check messages) and ``course slides``, and the
  banner of every generated file;
- ``dev``: ``course-dev``, the developers' tools that learners never need: the benchmarks
  (``course-dev bench cpu|gpu|llama-cpp``) and the one-call GPU check (``course-dev gpu-check``).

Four modules stand alone: ``messages`` speaks the learner's language in checks and feedback (read by
the kernel and the grader alike, from the compiled catalogues in ``locale/``), ``particles`` picks the
Korean particle that fits a value filled into a message, ``notebook_exec`` executes a notebook in a
kernel (for ``course run`` and the grading worker) and ``shipped_model`` trains and exports the GPT
shipped in ``course_utils/pretrained``. Nothing in ``course_utils`` imports this package.
"""
