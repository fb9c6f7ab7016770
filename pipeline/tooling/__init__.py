"""Around the stages: the notebooks' defaults (`notebook`), packaging the project for Kaggle (`packaging`,
`wheelcheck`), the tested versions (`versions`), the environment report (`doctor`) and scoring a submission
(`scoring`). May import every layer below it. Import the submodules directly.
"""
