"""The models heads-lab trains, as the Subject seam (heads_lab/analysis/subject.py) sees them:
a run trained here (trained.py). Pretrained Hugging Face models have theirs in
heads_lab/hf/subject.py; heads_lab/commands/command.py's `open_subject` picks the family by the
name the command line gives."""
